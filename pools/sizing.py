"""SGLang 0.5.23's memory sizing: KV tokens, request rows and mamba state slots from a model, a GPU and flags.

The path mirrors ``KVCacheConfigurator._resolve_memory_pool_config``
(``srt/mem_cache/kv_cache_configurator.py:3174``):

1. ``_profile_available_bytes`` (``:2990``): ``rest = free_after_weights - pre_model_load * (1 - mem_fraction_static)``,
   all in SGLang's "GB", which is GiB (``get_available_gpu_memory`` returns ``bytes / (1 << 30)``,
   ``srt/utils/common.py:575``); for hybrid models ``_handle_max_mamba_cache`` (``:3229``) takes the mamba
   pool out of ``rest`` first.
2. ``DefaultPoolConfigurator.calculate_pool_sizes`` (``model_executor/pool_configurator.py:637``):
   ``tokens = bytes // cell_size``, floored to a page multiple; ``_apply_token_constraints`` (``:3090``)
   caps it by ``--max-total-tokens``.
3. ``resolve_max_num_reqs`` (``:3119``): request rows, capped by the mamba slots.
4. The ``req_to_token`` table is allocated afterwards (``_build_req_to_token_pool``, ``:1571``), outside
   the budget, from what ``(1 - mem_fraction_static)`` left free.

What poolsim cannot measure: SGLang reads free GPU memory with ``torch.cuda.mem_get_info`` after the CUDA
context and distributed init (``pre_model_load_memory``) and again after loading weights. poolsim models the
first as the card's total minus ``runtime_overhead_gib`` and the second as that minus the weight bytes counted
from the config's shapes. Both are estimates, so the absolute token count can be off by
``(error in GiB) * 2**30 / cell_size`` tokens; everything downstream of ``rest`` (cell size, page flooring,
the mamba split, row counts, the sizes SGLang logs) is exact. Pass ``--max-total-tokens`` to pin the token
count to a logged value and reproduce SGLang's logged sizes to the digit.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields

from pools.errors import PoolError
from pools.gpu_catalog import GIB, GPUSpec
from pools.kv_cache import HybridLinearKVPool, KVCache, MHATokenToKVPool, MLATokenToKVPool
from pools.mamba_pool import MambaCacheParams, MambaPool
from pools.model_config import ModelConfig
from pools.server_args import ServerArgs

# CUDA context + NCCL/distributed init before SGLang takes its baseline; cannot be measured here.
# tp=1: H100 80GB, 81559 MiB = 79.65 GiB total, SGLang logs "Load weight begin. avail mem=78.43 GB"
#       (Llama-3.1-8B, 2026-02 SGLang docs CI log) -> 1.22 GiB.
# tp>1: H200, 143771 MiB = 140.40 GiB, "avail mem=137.29 GB" on TP ranks 1-6 at tp=8
#       (sgl-project/sglang#11716 log; "Init torch distributed ends. mem usage=2.01 GB") -> 3.11 GiB.
RUNTIME_OVERHEAD_GIB_TP1 = 1.22
RUNTIME_OVERHEAD_GIB_MULTI_GPU = 3.11

REQ_TO_TOKEN_EXTRA_CONTEXT = 4  # get_req_to_token_extra_context_len without spec decoding, allocation_sizing.py:105
REQ_TO_TOKEN_ENTRY_BYTES = 4  # int32, memory_pool.py:406
MAMBA_BASE_RATIO = 3  # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO, kv_cache_configurator.py:234
MAMBA_CONV_DTYPE = "bfloat16"  # SGLANG_MAMBA_CONV_DTYPE default, environ.py:1628
MAMBA_EXTRA_BUFFER_ARCHS = {"KimiLinearForCausalLM", "Qwen3NextForCausalLM", "NemotronHForCausalLM"}  # overrides.py:403
MAMBA_STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")
KV_CACHE_DTYPES = {"auto": None, "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16",
                   "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
MAMBA_SSM_DTYPES = ("float32", "bfloat16", "float16")


class SizingError(ValueError):
    """A configuration SGLang would refuse (or OOM on); the message is one line naming the parameter."""


@dataclass(frozen=True)
class MemoryPlan:
    """What SGLang 0.5.23 allocates on one tp rank. GiB = 2**30 bytes, as SGLang's logs ("GB")."""

    model: str
    gpu: str
    tp_size: int
    attention_arch: str  # mha | mla
    attention_backend: str
    kv_cache_dtype: str
    page_size: int
    mem_fraction_static: float
    chunked_prefill_size: int | None  # None: chunked prefill disabled (-1)
    max_prefill_tokens: int
    context_len: int  # the model's context length (SGLang logs it as context_len=)
    max_context_len: int  # req_to_token row width: context_len + 4 (ReqToTokenPool's max_context_len)
    max_req_len: int
    max_req_input_len: int
    # memory budget, GiB
    gpu_total_gib: float
    runtime_overhead_gib: float
    pre_model_load_gib: float
    weights_gib_per_rank: float
    available_after_weights_gib: float
    non_static_headroom_gib: float  # pre_model_load * (1 - mem_fraction_static)
    rest_gib: float  # KV (+ mamba) budget
    # KV pool
    cell_size_bytes: int  # bytes per token on this rank, full-attention layers only
    kv_layer_num: int
    kv_head_num: int  # per rank (MHA); 1 for MLA
    head_dim: int  # MHA k head dim; MLA kv_cache_dim = kv_lora_rank + qk_rope_head_dim
    v_head_dim: int  # MHA only
    kv_lora_rank: int  # MLA only
    qk_rope_head_dim: int  # MLA only
    profiled_max_total_num_tokens: int  # before --max-total-tokens
    max_total_num_tokens: int
    kv_cache_gib: float
    k_size_gib: float | None  # MHA, as "K size: x GB"
    v_size_gib: float | None
    kv_size_gib: float | None  # MLA, as "KV size: x GB"
    # request rows
    max_running_requests: int
    req_to_token_rows: int  # ReqToTokenPool size (row 0, the padding row, is extra)
    req_to_token_gib: float
    free_after_pools_gib: float  # what the req_to_token table, activations and graphs share
    rows_capped_by_mamba: bool
    full_attention_layer_ids: tuple[int, ...]
    # hybrid linear attention (None otherwise)
    linear_attn_kind: str | None = None  # kda | gdn | mamba2
    linear_layer_ids: tuple[int, ...] | None = None
    max_mamba_cache_size: int | None = None
    mamba_bytes_per_slot: int | None = None
    conv_state_gib: float | None = None
    ssm_state_gib: float | None = None
    mamba_conv_shape: tuple[tuple[int, ...], ...] | None = None
    mamba_temporal_shape: tuple[int, ...] | None = None
    mamba_conv_dtype: str | None = None
    mamba_ssm_dtype: str | None = None
    mamba_ratio: int | None = None  # state slots reserved per running request
    mamba_strategy: str | None = None  # no_buffer | extra_buffer | extra_buffer_lazy | off (no radix cache)
    overlap_forced_off: bool = False  # auto resolved to no_buffer, which turns the overlap scheduler off
    disable_overlap_schedule: bool = False
    warnings: tuple[str, ...] = ()  # what SGLang logs as warnings for this configuration

    @property
    def is_hybrid(self) -> bool:
        return self.max_mamba_cache_size is not None

    _MAMBA_KEYS = {"max_mamba_cache_size": "max_mamba_cache_size", "mamba_bytes_per_slot": "bytes_per_slot",
                   "conv_state_gib": "conv_state_gib", "ssm_state_gib": "ssm_state_gib",
                   "mamba_conv_shape": "conv_shape", "mamba_temporal_shape": "temporal_shape",
                   "mamba_conv_dtype": "conv_dtype", "mamba_ssm_dtype": "ssm_dtype", "mamba_ratio": "mamba_ratio",
                   "mamba_strategy": "strategy", "overlap_forced_off": "overlap_forced_off",
                   "linear_attn_kind": "kind", "linear_layer_ids": "layer_ids"}

    def to_dict(self) -> dict:
        """Flat fields, with the hybrid ones nested under ``mamba`` (None for non-hybrid models)."""
        d = {k: v for k, v in asdict(self).items() if k not in self._MAMBA_KEYS}
        d["mamba"] = ({out: getattr(self, k) for k, out in self._MAMBA_KEYS.items()} if self.is_hybrid else None)
        return d

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def make_kv_pool(self, device: str | None = None) -> KVCache:
        """The KV storage pool SGLang builds for this plan (buffers only on a torch device)."""
        size, page, dtype = self.max_total_num_tokens, self.page_size, self.kv_cache_dtype
        if self.is_hybrid:
            return HybridLinearKVPool(size, page, dtype, list(self.full_attention_layer_ids), mamba_pool=None,
                                      device=device, use_mla=self.attention_arch == "mla", head_num=self.kv_head_num,
                                      head_dim=self.head_dim, v_head_dim=self.v_head_dim,
                                      kv_lora_rank=self.kv_lora_rank, qk_rope_head_dim=self.qk_rope_head_dim)
        if self.attention_arch == "mla":
            return MLATokenToKVPool(size, page, dtype, self.kv_lora_rank, self.qk_rope_head_dim, self.kv_layer_num,
                                    device)
        return MHATokenToKVPool(size, page, dtype, self.kv_head_num, self.head_dim, self.kv_layer_num, device,
                                v_head_dim=self.v_head_dim)

    def mamba_cache_params(self) -> MambaCacheParams | None:
        """The state shapes and dtypes the simulator's ``MambaPool`` needs."""
        if not self.is_hybrid:
            return None
        from pools.mamba_pool import MambaStateShape

        shape = MambaStateShape(conv=[tuple(s) for s in self.mamba_conv_shape], temporal=self.mamba_temporal_shape,
                                kind=self.linear_attn_kind)
        return MambaCacheParams(shape=shape, layers=list(self.linear_layer_ids), conv_dtype=self.mamba_conv_dtype,
                                ssm_dtype=self.mamba_ssm_dtype)

    def table(self, concurrency: list["Concurrency"] | None = None) -> str:
        """The plan as a compact human-readable table."""
        rows = [
            ("model / gpu / tp", f"{self.model} / {self.gpu} / {self.tp_size}"),
            ("attention", f"{self.attention_arch.upper()} via {self.attention_backend}, KV {self.kv_cache_dtype}, "
                          f"page {self.page_size}"),
            ("mem_fraction_static", f"{self.mem_fraction_static}"),
            ("chunked_prefill_size", f"{self.chunked_prefill_size if self.chunked_prefill_size else 'disabled'}"
                                     f" (max_prefill_tokens {self.max_prefill_tokens})"),
            ("GPU total / before weights", f"{self.gpu_total_gib:.2f} / {self.pre_model_load_gib:.2f} GiB "
                                           f"(runtime overhead {self.runtime_overhead_gib:.2f} GiB, assumed)"),
            ("weights per rank", f"{self.weights_gib_per_rank:.2f} GiB"),
            ("KV + state budget (rest)", f"{self.rest_gib:.2f} GiB; headroom {self.non_static_headroom_gib:.2f} GiB"),
            ("cell size", f"{self.cell_size_bytes} B/token over {self.kv_layer_num} KV layers"),
            ("max_total_num_tokens", f"{self.max_total_num_tokens:,}"),
        ]
        if self.k_size_gib is not None:
            rows.append(("KV pool", f"K size: {self.k_size_gib:.2f} GB, V size: {self.v_size_gib:.2f} GB"))
        else:
            rows.append(("KV pool", f"KV size: {self.kv_size_gib:.2f} GB"))
        if self.is_hybrid:
            rows += [("mamba slots", f"{self.max_mamba_cache_size:,} x {self.mamba_bytes_per_slot:,} B "
                                     f"({self.linear_attn_kind}, {len(self.linear_layer_ids)} layers)"),
                     ("mamba pool", f"conv_state size: {self.conv_state_gib:.2f}GB, "
                                    f"ssm_state size: {self.ssm_state_gib:.2f}GB"),
                     ("mamba strategy", f"{self.mamba_strategy}, {self.mamba_ratio} slots per running request"
                                        + (", overlap scheduler forced off" if self.overlap_forced_off else ""))]
        rows += [("max_running_requests", f"{self.max_running_requests:,}"
                                          + (" (capped by mamba slots)" if self.rows_capped_by_mamba else "")),
                 ("req_to_token table", f"{self.req_to_token_rows + 1:,} x {self.max_context_len:,} int32 = "
                                        f"{self.req_to_token_gib:.2f} GiB of {self.free_after_pools_gib:.2f} GiB free")]
        rows += [("warning", w) for w in self.warnings]
        width = max(len(k) for k, _ in rows)
        out = [f"{k:<{width}}  {v}" for k, v in rows]
        if concurrency:
            out += ["", f"{'context len':>12}  {'max concurrency':>15}  {'KV limit':>10}  binds first"]
            out += [f"{c.context_len:>12,}  {c.max_concurrency:>15,}  {c.kv_limit:>10,}  {c.binding}"
                    for c in concurrency]
        return "\n".join(out)


@dataclass(frozen=True)
class Concurrency:
    context_len: int  # tokens per request (prompt + output)
    max_concurrency: int
    kv_limit: int  # requests the KV pool holds at this length
    rows_limit: int  # max_running_requests
    binding: str  # kv_tokens | request_rows | mamba_slots | context_len (longer than a request may be)


# ---- defaults SGLang resolves from the GPU ------------------------------------------------------


def default_runtime_overhead_gib(tp_size: int) -> float:
    return RUNTIME_OVERHEAD_GIB_TP1 if tp_size == 1 else RUNTIME_OVERHEAD_GIB_MULTI_GPU


def _capacity_tier(gpu: GPUSpec, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode CUDA-graph max_bs) by GPU memory, memory_hook.py:93-172."""
    mib = gpu.memory_mib
    if mib < 20 * 1024:
        return 2048, 8
    if mib < 35 * 1024:
        return 4096, 48 if tp < 4 else 160
    if mib < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if mib < 160 * 1024:  # the <90 GiB (H100, A100) and <160 GiB (H20, H200) tiers agree
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def default_chunked_prefill_size(gpu: GPUSpec, tp: int = 1) -> int:
    return _capacity_tier(gpu, tp)[0]


def decode_cuda_graph_max_bs(gpu: GPUSpec, tp: int, max_running_requests: int | None = None) -> int:
    """The largest decode batch SGLang captures a CUDA graph for: the capacity tier's max_bs
    (memory_hook.py:93-172), capped by --max-running-requests (memory_hook.py:174-180)."""
    max_bs = _capacity_tier(gpu, tp)[1]
    return min(max_bs, max_running_requests) if max_running_requests else max_bs


def prefill_cuda_graph_bs(max_bs: int) -> list[int]:
    """generate_prefill_cuda_graph_batch_sizes (cuda_graph_hook.py:480)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_bs + 1, 512)))
    return [s for s in sizes if s <= max_bs]


def default_mem_fraction_static(model: ModelConfig, gpu: GPUSpec, args: ServerArgs, chunked_prefill_size: int) -> float:
    """handle_gpu_memory_settings (memory_hook.py:47-290) without post-capture sizing (its env flag is off)."""
    tp = args.tp_size
    gpu_mem = gpu.memory_mib  # MiB
    decode_max_bs = decode_cuda_graph_max_bs(gpu, tp, args.max_running_requests)
    if chunked_prefill_size > 0:
        activation_tokens = max(chunked_prefill_size, 2048)
    else:
        activation_tokens = max(args.max_prefill_tokens, 2048)
    reserved = 512  # MiB: constant metadata (attention backend)
    reserved += activation_tokens * 1.5  # MiB: activations
    reserved += tp * 1 / 8 * 1024  # MiB: tp * pp / 8 GiB for large parallel sizes
    reserved += _reserve_for_graph_mib(model, gpu, args, decode_max_bs, chunked_prefill_size)  # MiB
    if gpu_mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)  # MiB: a 10 GiB floor on big cards
    return round((gpu_mem - reserved) / gpu_mem, 3)


def prefill_cuda_graph_on(model: ModelConfig, gpu: GPUSpec, args: ServerArgs) -> bool:
    # breakable prefill graphs are the CUDA default (cuda_graph_config.py:119); KDA models turn them
    # off (cuda_graph_hook.py:160-170), and so does --disable-prefill-cuda-graph
    return gpu.vendor == "nvidia" and not args.disable_cuda_graph and not args.disable_prefill_cuda_graph and not (
        model.linear_attn is not None and model.linear_attn.kind == "kda")


def _reserve_for_graph_mib(model, gpu, args, decode_max_bs: int, chunked_prefill_size: int) -> float:
    """reserve_for_graph_mb (memory_hook.py:292-332)."""
    reserved = 0.0
    if not args.disable_cuda_graph:
        reserved += decode_max_bs * 2  # MiB: decode graphs
    if prefill_cuda_graph_on(model, gpu, args):
        if model.use_mla:
            reserved += 1.5 * 1024  # MiB: MLA prefill graph overhead
        else:
            max_bs = chunked_prefill_size
            if args.max_total_tokens is not None:
                max_bs = min(max_bs, args.max_total_tokens)
            reserved += len(prefill_cuda_graph_bs(max_bs)) * 8  # MiB per captured prefill size
    return reserved


def resolve_attention_backend(model: ModelConfig, gpu: GPUSpec, args: ServerArgs, kv_heads_per_rank: int,
                              extra_buffer: bool) -> tuple[str, int | None]:
    """(backend, page size a model override forces or None): get_default_attn_backend
    (model_override_base.py:277) plus the DeepSeek, Qwen3-Next and Nemotron-H sm100 overrides."""
    if args.attention_backend is not None:
        backend = args.attention_backend
    elif gpu.arch == "sm100" and model.architecture == "DeepseekV3ForCausalLM":
        backend = "trtllm_mla"  # arg_groups/model_overrides/deepseek_v2.py:176-186
    elif gpu.arch == "sm100" and model.architecture == "Qwen3NextForCausalLM":
        # model_overrides/qwen3_5.py:24-48: trtllm_mha at page 64 unless the radix cache runs without
        # the extra buffer (then page 1 and triton)
        no_buffer_radix = not extra_buffer and not args.disable_radix_cache
        return ("triton", 1) if no_buffer_radix else ("trtllm_mha", 64)
    elif gpu.arch == "sm100" and model.architecture == "NemotronHForCausalLM":
        backend = "trtllm_mha"  # model_overrides/nemotron_h.py:142-143
    elif not model.use_mla:
        backend = {"sm90": "fa3", "gfx942": "aiter"}.get(gpu.arch, "flashinfer")
        if gpu.arch == "sm100":
            backend = "fa4" if model.head_dim != model.v_head_dim else "trtllm_mha"
    else:
        backend = {"sm90": "fa3", "sm100": "flashinfer"}.get(gpu.arch, "triton")
        if gpu.arch == "gfx942":
            backend = "aiter" if kv_heads_per_rank in (16, 128) else "triton"
    if backend == "fa3" and args.kv_cache_dtype == "fp8_e5m2":
        backend = "triton"  # overrides.py:1272-1280
    return backend, None


def resolve_page_size(model: ModelConfig, gpu: GPUSpec, backend: str, page_size: int) -> int:
    """_mla_backend_page_constraints and _fa4_page_constraint (overrides.py:1143-1300)."""
    if backend == "flashmla":
        return 64
    if backend in ("trtllm_mla", "cutedsl_mla") and page_size not in (32, 64):
        return 64
    if backend == "trtllm_mha" and page_size not in (16, 32, 64, 128):
        return 64
    if backend == "fa4" and not model.use_mla and gpu.arch == "sm100":
        return 128
    return page_size


def resolve_mamba_strategy(model: ModelConfig, gpu: GPUSpec, args: ServerArgs) -> tuple[str, bool, bool]:
    """(strategy, disable_overlap_schedule, overlap_forced_off): _mamba_radix_cache_resolution (overrides.py:454)."""
    overlap_off = args.disable_overlap_schedule
    if args.disable_radix_cache:
        return "off", overlap_off, False
    strategy = args.mamba_radix_cache_strategy
    if strategy == "auto":
        wants_overlap = not overlap_off
        wants_paging = args.page_size > 1
        # linear_attn_backend defaults to triton, which supports the extra buffer (overrides.py:436-450)
        if (wants_overlap or wants_paging) and model.architecture in MAMBA_EXTRA_BUFFER_ARCHS:
            return "extra_buffer", overlap_off, False
        return "no_buffer", True, not overlap_off
    return strategy, overlap_off, False


def mamba_ratio(strategy: str, disable_overlap_schedule: bool) -> int:
    """_calculate_mamba_ratio (kv_cache_configurator.py:3062): slots a running request may hold."""
    if strategy == "off":
        return 1
    tracking_slots = 0  # get_mamba_tracking_slots, allocation_sizing.py:11
    if strategy == "extra_buffer_lazy":
        tracking_slots = 1
    elif strategy == "extra_buffer":
        tracking_slots = 1 if disable_overlap_schedule else 2
    return MAMBA_BASE_RATIO + tracking_slots


# ---- pools -------------------------------------------------------------------------------------


def resolve_kv_cache_dtype(model: ModelConfig, kv_cache_dtype: str) -> str:
    """configure_kv_cache_dtype (mem_cache/kv_cache_dtype.py:34): auto = the model dtype (fp8 when the
    checkpoint's quantization_config declares an FP8 KV cache)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise SizingError(f"--kv-cache-dtype {kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
    if kv_cache_dtype == "auto":
        return "fp8_e4m3" if model.kv_cache_quant_fp8 else model.dtype
    return KV_CACHE_DTYPES[kv_cache_dtype]


def kv_heads_per_rank(model: ModelConfig, tp: int) -> int:
    """get_num_kv_heads (configs/model_config.py:1700): max(1, kv_heads // tp)."""
    return max(1, model.num_key_value_heads // tp)


def make_kv_pool(model: ModelConfig, tp: int, size: int, page_size: int, dtype: str) -> KVCache:
    """The KV storage pool SGLang builds (sizes only; no buffers without a device)."""
    if model.is_hybrid:
        return HybridLinearKVPool(size, page_size, dtype, model.full_attention_layer_ids, mamba_pool=None,
                                  use_mla=model.use_mla, head_num=kv_heads_per_rank(model, tp),
                                  head_dim=model.head_dim, v_head_dim=model.v_head_dim,
                                  kv_lora_rank=model.kv_lora_rank, qk_rope_head_dim=model.qk_rope_head_dim)
    layers = len(model.full_attention_layer_ids)
    if model.use_mla:
        return MLATokenToKVPool(size, page_size, dtype, model.kv_lora_rank, model.qk_rope_head_dim, layers)
    return MHATokenToKVPool(size, page_size, dtype, kv_heads_per_rank(model, tp), model.head_dim, layers,
                            v_head_dim=model.v_head_dim)


def mamba_cache_params(model: ModelConfig, tp: int, ssm_dtype_flag: str | None) -> MambaCacheParams:
    """``mamba2_cache_params``; SSM dtype: --mamba-ssm-dtype, else the config's mamba_ssm_dtype, else float32
    (mamba2_state_dtype, configs/mamba_utils.py:47-107)."""
    if ssm_dtype_flag is not None and ssm_dtype_flag not in MAMBA_SSM_DTYPES:
        raise SizingError(f"--mamba-ssm-dtype {ssm_dtype_flag!r} is not one of {', '.join(MAMBA_SSM_DTYPES)}")
    config_dtype = model.mamba_ssm_dtype if model.mamba_ssm_dtype in MAMBA_SSM_DTYPES else None
    ssm_dtype = ssm_dtype_flag or config_dtype or "float32"
    try:
        shape = model.linear_attn.state_shape(tp)
    except PoolError as e:
        raise SizingError(f"--tp {tp}: {e} (SGLang's divide() asserts)") from None
    return MambaCacheParams(shape=shape, layers=model.linear_layer_ids, conv_dtype=MAMBA_CONV_DTYPE,
                            ssm_dtype=ssm_dtype)


def split_mamba_budget(rest_gib: float, per_slot_bytes: int, mamba_full_memory_ratio: float) -> tuple[int, float]:
    """The default branch of _handle_max_mamba_cache (kv_cache_configurator.py:3366-3409), no spec decoding.

    Returns (max_mamba_cache_size, rest_gib left for KV). Float GiB arithmetic in SGLang's order.
    """
    r = mamba_full_memory_ratio
    mamba_budget = rest_gib * r / (1 + r)  # GiB: r/(1+r) of rest goes to state
    mamba_budget_bytes = mamba_budget * (1 << 30)  # B
    # slots: floor(budget / slot) - 1, the padding slot paid for
    max_mamba_cache_size = int((mamba_budget_bytes - per_slot_bytes) // per_slot_bytes)
    return max_mamba_cache_size, rest_gib - _mamba_state_gib(max_mamba_cache_size, per_slot_bytes)


def _mamba_state_gib(max_mamba_cache_size: int, per_slot_bytes: int) -> float:
    return (max_mamba_cache_size + 1) * per_slot_bytes / (1 << 30)  # GiB, slot 0 included


def resolve_max_num_reqs(token_capacity: int, context_len: int, max_running_requests: int | None,
                         max_mamba_cache_size: int | None = None, ratio: int = 1) -> tuple[int, bool]:
    """resolve_max_num_reqs (kv_cache_configurator.py:3119-3172), dp 1. Returns (rows, capped by mamba)."""
    estimated = int(token_capacity / context_len * 512)  # rows: 512 per context's worth of tokens
    estimated = max(min(estimated, 4096), 2048)  # rows: clamped to [2048, 4096]
    if max_running_requests is not None:
        max_num_reqs = min(max(1, max_running_requests), token_capacity // 2)
    else:
        max_num_reqs = min(estimated, token_capacity // 2)
    capped = False
    if max_mamba_cache_size is not None:
        mamba_cap = max_mamba_cache_size // ratio  # rows: each running request may hold `ratio` slots
        capped = mamba_cap < max_num_reqs
        max_num_reqs = min(max_num_reqs, mamba_cap)
        if max_num_reqs <= 0:
            raise SizingError(f"max_mamba_cache_size {max_mamba_cache_size} // mamba_ratio {ratio} leaves no "
                              "request rows; raise --mem-fraction-static or --max-mamba-cache-size")
    return max_num_reqs, capped


def validate_tp(model: ModelConfig, tp: int) -> None:
    """The tp divisibility asserts SGLang's model classes make (e.g. models/llama.py:183-193)."""
    if tp < 1:
        raise SizingError(f"--tp {tp} must be >= 1")
    heads, kv = model.num_attention_heads, model.num_key_value_heads
    if model.full_attention_layer_ids:
        if heads % tp:
            raise SizingError(f"--tp {tp} does not divide num_attention_heads {heads}")
        if not model.use_mla and kv >= tp and kv % tp:
            raise SizingError(f"--tp {tp} does not divide num_key_value_heads {kv}")
        if not model.use_mla and kv < tp and tp % kv:
            raise SizingError(f"--tp {tp} is not a multiple of num_key_value_heads {kv}")
    if model.linear_attn is not None and model.linear_attn.num_heads % tp:
        raise SizingError(f"--tp {tp} does not divide the {model.linear_attn.kind} heads {model.linear_attn.num_heads}")
    if model.quant_method == "fp8" and model.weight_block_size is not None and tp > 1:
        block_n = model.weight_block_size[0]
        for name, size in (("intermediate_size", model.intermediate_size),
                           ("moe_intermediate_size", model.moe.intermediate_size if model.moe else 0)):
            if size and (size // tp) % block_n:  # fp8.py validate_block_quant_shapes
                raise SizingError(f"--tp {tp}: {name} {size} / tp = {size // tp} is not divisible by the fp8 "
                                  f"weight block {block_n}")


# ---- the plan ----------------------------------------------------------------------------------


def plan_memory(model: ModelConfig, gpu: GPUSpec, args: ServerArgs, *,
                runtime_overhead_gib: float | None = None) -> MemoryPlan:
    tp = args.tp_size
    validate_tp(model, tp)
    if args.page_size < 1 or args.page_size & (args.page_size - 1):
        raise SizingError(f"--page-size {args.page_size} is not a power of two")
    if args.mem_fraction_static is not None and not 0 < args.mem_fraction_static < 1:
        raise SizingError(f"--mem-fraction-static {args.mem_fraction_static} is not in (0, 1)")
    if args.mamba_radix_cache_strategy not in MAMBA_STRATEGIES:
        raise SizingError(f"--mamba-radix-cache-strategy {args.mamba_radix_cache_strategy!r} is not one of "
                          f"{', '.join(MAMBA_STRATEGIES)}")
    for flag, value in (("--max-total-tokens", args.max_total_tokens), ("--max-running-requests",
                        args.max_running_requests), ("--max-mamba-cache-size", args.max_mamba_cache_size)):
        if value is not None and value < 1:
            raise SizingError(f"{flag} {value} must be >= 1")
    context_len = _resolve_context_len(model, args)
    kv_dtype = resolve_kv_cache_dtype(model, args.kv_cache_dtype)

    strategy, disable_overlap, overlap_forced_off = (None, args.disable_overlap_schedule, False)
    if model.is_hybrid:
        strategy, disable_overlap, overlap_forced_off = resolve_mamba_strategy(model, gpu, args)
    extra_buffer = strategy in ("extra_buffer", "extra_buffer_lazy")
    backend, forced_page = resolve_attention_backend(model, gpu, args, kv_heads_per_rank(model, tp), extra_buffer)
    page_size = resolve_page_size(model, gpu, backend, forced_page or args.page_size)
    if model.is_hybrid:
        _validate_mamba_strategy(strategy, page_size, disable_overlap, args)

    chunked = args.chunked_prefill_size
    if chunked is None:
        chunked = default_chunked_prefill_size(gpu, tp)
    mem_fraction_static = args.mem_fraction_static
    if mem_fraction_static is None:
        mem_fraction_static = default_mem_fraction_static(model, gpu, args, chunked)
    if backend == "aiter" and context_len > 8192:
        mem_fraction_static = mem_fraction_static * 0.85  # attention_hook.py:244-268 (explicit values too)

    # _profile_available_bytes, in SGLang's GiB floats
    overhead = default_runtime_overhead_gib(tp) if runtime_overhead_gib is None else runtime_overhead_gib
    gpu_total = gpu.total_bytes / GIB  # GiB
    pre_model_load = gpu_total - overhead  # GiB free when SGLang takes its baseline
    weights = model.weight_bytes_per_rank(tp) / GIB  # GiB of weights on this rank
    available = pre_model_load - weights  # GiB free after loading weights
    slack = pre_model_load * (1 - mem_fraction_static)  # GiB kept for activations, graphs, req_to_token
    rest = available - slack  # GiB for KV (and mamba state)
    if available <= 0:
        raise SizingError(f"--tp {tp}: {model.name} weights need {weights:.2f} GiB per rank, more than the "
                          f"{pre_model_load:.2f} GiB free on {gpu.name}")
    if rest <= 0:
        minimum = 1 - available / pre_model_load  # kv_cache_configurator.py:3041-3060
        raise SizingError(f"--mem-fraction-static {mem_fraction_static}: weights ({weights:.2f} GiB per rank) leave "
                          f"no KV memory on {gpu.name}; raise it above {math.ceil(minimum * 1000) / 1000:.3f}")
    rest_before_mamba = rest

    mamba = None
    if model.is_hybrid:
        params = mamba_cache_params(model, tp, args.mamba_ssm_dtype)
        per_slot = params.mamba_cache_per_req  # B over all linear layers
        if args.max_mamba_cache_size is not None:
            source, max_mamba = "--max-mamba-cache-size", args.max_mamba_cache_size  # // dp
        elif args.disable_radix_cache and args.max_running_requests is not None:
            source, max_mamba = "--max-running-requests", max(1, args.max_running_requests)
        else:
            source = "--mamba-full-memory-ratio"
            max_mamba, _ = split_mamba_budget(rest, per_slot, args.mamba_full_memory_ratio)
        if max_mamba <= 0:
            raise SizingError(f"max_mamba_cache_size {max_mamba}: rest {rest:.2f} GiB holds no "
                              f"{per_slot / 2**20:.2f} MiB state slot; raise --mem-fraction-static")
        rest = rest - _mamba_state_gib(max_mamba, per_slot)
        if rest <= 0:
            raise SizingError(f"{source}: max_mamba_cache_size {max_mamba} needs {max_mamba + 1} slots of "
                              f"{per_slot / 2**20:.2f} MiB, more than the {rest_before_mamba:.2f} GiB budget")
        mamba = (params, per_slot, max_mamba)

    available_bytes = int(rest * (1 << 30))  # B, as _profile_available_bytes returns
    cell = make_kv_pool(model, tp, 0, page_size, kv_dtype).cell_size_bytes()  # B per token
    profiled = available_bytes // cell // page_size * page_size  # tokens, page-floored
    warnings = []
    max_total_num_tokens = profiled
    if args.max_total_tokens is not None:
        if args.max_total_tokens > profiled:  # kv_cache_configurator.py:3101-3106
            warnings.append(f"max_total_tokens={args.max_total_tokens} is larger than the profiled value "
                            f"{profiled}. Use the profiled value instead.")
        max_total_num_tokens = min(profiled, args.max_total_tokens) // page_size * page_size
    if max_total_num_tokens <= 0:
        raise SizingError(f"max_total_num_tokens {max_total_num_tokens}: {rest:.2f} GiB holds no page of "
                          f"{page_size} tokens x {cell} B; raise --mem-fraction-static")

    ratio = mamba_ratio(strategy, disable_overlap) if model.is_hybrid else 1
    max_reqs, capped = resolve_max_num_reqs(max_total_num_tokens, context_len, args.max_running_requests,
                                            mamba[2] if mamba else None, ratio)
    if capped:  # kv_cache_configurator.py:3140-3156
        warnings.append(f"max_running_requests is capped to {max_reqs} by the mamba state cache "
                        f"(max_mamba_cache_size={mamba[2]}, {ratio} state slots per request)")
    elif args.max_running_requests is not None and max_reqs < args.max_running_requests:
        warnings.append(f"max_running_requests was reduced from the requested {args.max_running_requests} to "
                        f"{max_reqs} due to the available KV cache capacity")
    if max_total_num_tokens < context_len:  # tp_worker.py:555-566
        warnings.append(f"KV pool holds {max_total_num_tokens} tokens, fewer than --context-length {context_len}. "
                        "One full-length request cannot fit.")

    kv_pool = make_kv_pool(model, tp, max_total_num_tokens, page_size, kv_dtype)
    kv_sizes = kv_pool.get_kv_size_bytes()  # B with size + page_size rows per layer
    kv_total = sum(kv_sizes) if isinstance(kv_sizes, tuple) else kv_sizes
    max_context_len = context_len + REQ_TO_TOKEN_EXTRA_CONTEXT  # tokens per req_to_token row
    req_to_token_bytes = (max_reqs + 1) * max_context_len * REQ_TO_TOKEN_ENTRY_BYTES  # B, row 0 included
    mamba_total = 0
    hybrid_fields = {}
    if mamba:
        params, per_slot, max_mamba = mamba
        pool = MambaPool(max_mamba, params)
        mamba_total = pool.mem_usage_bytes()
        hybrid_fields = dict(
            linear_attn_kind=model.linear_attn.kind, linear_layer_ids=tuple(model.linear_layer_ids),
            max_mamba_cache_size=max_mamba, mamba_bytes_per_slot=per_slot,
            conv_state_gib=pool.conv_state_bytes() / GIB, ssm_state_gib=pool.ssm_state_bytes() / GIB,
            mamba_conv_shape=tuple(tuple(s) for s in params.shape.conv), mamba_temporal_shape=params.shape.temporal,
            mamba_conv_dtype=params.conv_dtype, mamba_ssm_dtype=params.ssm_dtype, mamba_ratio=ratio,
            mamba_strategy=strategy, overlap_forced_off=overlap_forced_off)
    free_after_pools = available - (kv_total + mamba_total) / GIB  # GiB free once the pools exist
    if req_to_token_bytes / GIB > free_after_pools:
        raise SizingError(f"--context-length {context_len}: the req_to_token table ({max_reqs + 1} rows x "
                          f"{max_context_len} int32 = {req_to_token_bytes / GIB:.2f} GiB) "
                          f"exceeds the {free_after_pools:.2f} GiB left after the pools; lower --context-length "
                          "or --max-running-requests")
    max_req_len = min(context_len - 1, max_total_num_tokens - 1)  # tp_worker.py:568-571

    return MemoryPlan(
        model=model.name, gpu=gpu.name, tp_size=tp, attention_arch=model.attention_arch,
        attention_backend=backend, kv_cache_dtype=kv_dtype, page_size=page_size,
        mem_fraction_static=mem_fraction_static, chunked_prefill_size=chunked if chunked > 0 else None,
        max_prefill_tokens=args.max_prefill_tokens, context_len=context_len, max_context_len=max_context_len,
        max_req_len=max_req_len,
        max_req_input_len=max_req_len - 5,
        gpu_total_gib=gpu_total, runtime_overhead_gib=overhead, pre_model_load_gib=pre_model_load,
        weights_gib_per_rank=weights, available_after_weights_gib=available, non_static_headroom_gib=slack,
        rest_gib=rest_before_mamba,
        cell_size_bytes=cell, kv_layer_num=len(model.full_attention_layer_ids),
        kv_head_num=1 if model.use_mla else kv_heads_per_rank(model, tp),
        head_dim=model.kv_lora_rank + model.qk_rope_head_dim if model.use_mla else model.head_dim,
        v_head_dim=0 if model.use_mla else model.v_head_dim,
        kv_lora_rank=model.kv_lora_rank, qk_rope_head_dim=model.qk_rope_head_dim,
        profiled_max_total_num_tokens=profiled, max_total_num_tokens=max_total_num_tokens,
        kv_cache_gib=kv_total / GIB,
        k_size_gib=kv_sizes[0] / GIB if isinstance(kv_sizes, tuple) else None,
        v_size_gib=kv_sizes[1] / GIB if isinstance(kv_sizes, tuple) else None,
        kv_size_gib=None if isinstance(kv_sizes, tuple) else kv_sizes / GIB,
        max_running_requests=max_reqs, req_to_token_rows=max_reqs, req_to_token_gib=req_to_token_bytes / GIB,
        free_after_pools_gib=free_after_pools, rows_capped_by_mamba=capped,
        full_attention_layer_ids=tuple(model.full_attention_layer_ids),
        disable_overlap_schedule=disable_overlap, warnings=tuple(warnings), **hybrid_fields)


def _resolve_context_len(model: ModelConfig, args: ServerArgs) -> int:
    """ModelConfig._derive_context_length (configs/model_config.py:1291): a longer --context-length is refused."""
    if args.context_length is None:
        return model.derived_context_len
    if args.context_length < 1:
        raise SizingError(f"--context-length {args.context_length} must be >= 1")
    if args.context_length > model.derived_context_len:
        raise SizingError(f"--context-length {args.context_length} exceeds the model's derived context length "
                          f"{model.derived_context_len} (SGLang refuses without "
                          "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1)")
    return args.context_length


def _validate_mamba_strategy(strategy: str, page_size: int, disable_overlap: bool, args: ServerArgs) -> None:
    """validate_mamba_no_buffer / validate_mamba_extra_buffer (arg_groups/mamba_hook.py:115-175)."""
    if strategy == "no_buffer":
        if page_size != 1:
            raise SizingError(f"--mamba-radix-cache-strategy no_buffer needs page_size 1, got {page_size}")
        if not disable_overlap:
            raise SizingError("--mamba-radix-cache-strategy no_buffer needs --disable-overlap-schedule")
    if strategy in ("extra_buffer", "extra_buffer_lazy") and args.mamba_track_interval % page_size:
        raise SizingError(f"--page-size {page_size} does not divide mamba_track_interval {args.mamba_track_interval}")


# ---- capacity at a context length ----------------------------------------------------------------


def max_concurrency(plan: MemoryPlan, context_lens: list[int]) -> list[Concurrency]:
    """How many requests of each total length fit at once, and which pool runs out first.

    KV: whole pages per request (ceil_page(L)). Rows: max_running_requests, which for hybrids already
    counts ``mamba_ratio`` state slots per request; when that cap bound the rows, mamba slots bind.
    """
    out = []
    rows = plan.max_running_requests
    for length in context_lens:
        if length > plan.max_req_len + 1:
            out.append(Concurrency(length, 0, 0, rows, "context_len"))
            continue
        pages = -(-length // plan.page_size) * plan.page_size  # tokens held, page-rounded
        kv_limit = plan.max_total_num_tokens // pages
        if kv_limit < rows:
            binding = "kv_tokens"
        else:
            binding = "mamba_slots" if plan.rows_capped_by_mamba else "request_rows"
        out.append(Concurrency(length, min(kv_limit, rows), kv_limit, rows, binding))
    return out


def bytes_per_request(plan: MemoryPlan, context_len: int) -> int:
    """KV of ``context_len`` tokens (page-rounded) plus one state slot for hybrids, on one rank."""
    pages = -(-context_len // plan.page_size) * plan.page_size
    return pages * plan.cell_size_bytes + (plan.mamba_bytes_per_slot or 0)


def crossover_context_len(hybrid: ModelConfig, args: ServerArgs, slots: int = 1) -> int:
    """The shortest request for which ``slots`` state slots cost no more than the KV the linear layers would
    hold as full-attention layers: ceil(slots * bytes_per_slot / extra KV bytes per token)."""
    if not hybrid.is_hybrid:
        raise SizingError(f"--compare: {hybrid.name} has no linear-attention layers")
    tp = args.tp_size
    dtype = resolve_kv_cache_dtype(hybrid, args.kv_cache_dtype)
    full_cell = make_kv_pool(hybrid.with_full_attention(), tp, 0, 1, dtype).cell_size_bytes()
    hybrid_cell = make_kv_pool(hybrid, tp, 0, 1, dtype).cell_size_bytes()
    per_slot = mamba_cache_params(hybrid, tp, args.mamba_ssm_dtype).mamba_cache_per_req
    return -(-slots * per_slot // (full_cell - hybrid_cell))


def compare_records(plans: dict[str, MemoryPlan], context_lens: list[int]) -> list[dict]:
    """Rows (model, context_len, bytes_per_request, max_concurrency, binding) for tables and plots."""
    rows = []
    for label, plan in plans.items():
        for c in max_concurrency(plan, context_lens):
            rows.append(dict(model=label, context_len=c.context_len,
                             bytes_per_request=bytes_per_request(plan, c.context_len),
                             max_concurrency=c.max_concurrency, binding=c.binding))
    return rows


def plan_field_names() -> list[str]:
    return [f.name for f in fields(MemoryPlan)]


def compare_table(records: list[dict]) -> str:
    """``compare_records`` as one line per context length: GiB per request and max concurrency per model."""
    labels = list(dict.fromkeys(r["model"] for r in records))
    by_len: dict[int, dict[str, dict]] = {}
    for r in records:
        by_len.setdefault(r["context_len"], {})[r["model"]] = r
    width = max(22, *(len(label) for label in labels))
    head = f"{'context len':>12}" + "".join(f"  {label:>{width}}" for label in labels)
    sub = f"{'':>12}" + "".join(f"  {'GiB/req   max reqs':>{width}}" for _ in labels)
    lines = [head, sub]
    for length in sorted(by_len):
        cells = []
        for label in labels:
            r = by_len[length][label]
            cells.append(f"  {r['bytes_per_request'] / GIB:>{width - 11}.4f}  {r['max_concurrency']:>9,}")
        lines.append(f"{length:>12,}" + "".join(cells))
    return "\n".join(lines)
