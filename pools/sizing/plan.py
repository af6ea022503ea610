"""SGLang 0.5.23's memory sizing: KV tokens, request rows and mamba state slots from a model, a GPU and flags.

The path mirrors ``KVCacheConfigurator._resolve_memory_pool_config``
(``srt/mem_cache/kv_cache_configurator.py:3174``):

1. ``_profile_available_bytes`` (``:2990``): ``rest = free_after_weights - pre_model_load * (1 - mem_fraction_static)``,
   all in SGLang's "GB", which is GiB (``get_available_gpu_memory`` returns ``bytes / (1 << 30)``,
   ``srt/utils/common.py:575``); for hybrid models ``_handle_max_mamba_cache`` (``:3229``) takes the mamba
   pool out of ``rest`` first.
2. The pool kind's configurator (``pools/sizing/pool_configurator.py``, ``model_executor/pool_configurator.py``):
   ``tokens = bytes // cell_size``, floored to a page multiple (hybrid SWA: split into a full and an SWA
   pool); ``_apply_token_constraints`` (``:3090``) caps it by ``--max-total-tokens``. The defaults SGLang
   resolves first (backend, page size, KV dtype, mem_fraction_static) are ``pools/sizing/server_defaults.py``;
   the mamba state term is ``pools/sizing/mamba.py``.
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

from poolsim.pools.dtypes import dtype_bytes
from poolsim.pools.errors import PoolError, SizingError
from poolsim.pools.hardware.gpu_catalog import GIB, GPUSpec
from poolsim.pools.mem_cache.pool.base import KVCache
from poolsim.pools.mem_cache.pool.hybrid import HybridLinearKVPool
from poolsim.pools.mem_cache.pool.mamba import MambaCacheParams, MambaPool
from poolsim.pools.mem_cache.pool.mha import MHATokenToKVPool
from poolsim.pools.mem_cache.pool.mla import MLATokenToKVPool
from poolsim.pools.mem_cache.pool.swa import SWAKVPool
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.hicache import HiCachePlan, plan_hicache
from poolsim.pools.sizing.mamba import (  # noqa: F401 (re-exported: the sizing API)
    MAMBA_STRATEGIES,
    _mamba_state_gib,
    _validate_mamba_strategy,
    mamba_cache_params,
    mamba_ratio,
    resolve_mamba_strategy,
    spec_verify_reqs,
    spec_verify_state_bytes,
    split_mamba_budget,
)
from poolsim.pools.sizing.parallel import (
    ParallelLayout,
    check_nodes,
    pp_stages,
    resolve_layout,
    weight_bytes_per_rank,
)
from poolsim.pools.sizing.pool_configurator import pool_configurator
from poolsim.pools.sizing.server_args import ServerArgs
from poolsim.pools.sizing.server_defaults import (  # noqa: F401 (re-exported: the sizing API)
    default_chunked_prefill_size,
    default_mem_fraction_static,
    default_runtime_overhead_gib,
    kv_heads_per_rank,
    resolve_attention_backend,
    resolve_kv_cache_dtype,
    resolve_page_size,
)
from poolsim.pools.sizing.speculative import (
    SPEC_MAX_RUNNING_REQUESTS,
    SpeculativeConfig,
    check_backend,
    draft_weight_bytes,
    resolve_speculative,
)

REQ_TO_TOKEN_EXTRA_CONTEXT = 4  # get_req_to_token_extra_context_len without spec decoding, allocation_sizing.py:105
REQ_TO_TOKEN_ENTRY_BYTES = 4  # int32, memory_pool.py:406
MM_EMBEDDING_CACHE_MIB = 100  # SGLANG_VLM_CACHE_SIZE_MB default (environ.py:1598)


@dataclass(frozen=True)
class SpeculativePlan:
    """What speculative decoding adds to a plan (``plan --json``'s ``speculative`` object); GiB = 2**30 bytes."""

    algorithm: str  # EAGLE | EAGLE3 | STANDALONE (NEXTN runs as EAGLE)
    requested: str
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    auto_params: bool  # SGLang's _auto_choose_speculative_params picked the three
    draft_model: str
    draft_architecture: str
    draft_source: str
    nextn: bool  # NextN/MTP layers of a checkpoint
    draft_layers: int  # eagle_draft_num_layers: the layers the target's budget reserves for (0: none)
    draft_pool_layers: int  # the layers of the draft's own KV pool
    draft_cell_bytes: int  # B per token of the draft's pool (its own geometry), one rank
    reserved_cell_bytes: int  # B per token the target's budget reserves for it (layer-count scaling)
    draft_pool_tokens: int  # = the target's max_total_num_tokens (one slot index space)
    draft_pool_gib: float  # the draft's KV pool as allocated (size + page rows)
    draft_weights_gib: float  # per rank, resident when the target's pool is sized
    target_tokens_without_draft: int  # max_total_num_tokens with the same budget and no reservation
    target_token_reduction: int  # tokens the reservation takes from the target's pool
    target_token_reduction_frac: float
    verify_buffers_gib: float  # hybrid models: intermediate SSM/conv states of a verify pass (SGLang's budget)
    verify_buffer_reqs: int  # hybrid models: the requests those buffers are sized for (0 otherwise)
    max_running_requests: int  # the request cap SGLang runs with (48 unless --max-running-requests)
    alloc_len_per_decode: int  # KV slots one request may take per decode step
    alloc_reserve_per_decode: int  # the decode reservation: 2 x alloc_len (the overlap loop's lag)
    req_to_token_extra_context: int  # the row headroom past the context length
    accept_length: float | None
    accept_file: str | None
    notes: tuple[str, ...] = ()


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
    # sliding-window attention (None for models without windowed layers)
    sliding_window: int | None = None
    swa_layer_ids: tuple[int, ...] | None = None
    swa_pool: str | None = None  # "hybrid": a separate SWA pool | "all-full": every layer sized as full
    swa_full_tokens_ratio: float | None = None
    full_max_total_num_tokens: int | None = None  # "full_layer_tokens=" of SGLang's log
    swa_max_total_num_tokens: int | None = None  # "swa_layer_tokens="
    full_k_size_gib: float | None = None  # "Full KV Cache is allocated ... K size"
    full_v_size_gib: float | None = None
    swa_k_size_gib: float | None = None  # "SWA KV Cache is allocated ... K size"
    swa_v_size_gib: float | None = None
    swa_kv_head_num: int | None = None
    swa_head_dim: int | None = None
    swa_v_head_dim: int | None = None
    # parallelism (pools/sizing/parallel.py): every size above is per rank; max_running_requests and the KV
    # pool are one attention-DP group's
    attn_dp_size: int = 1
    attn_tp_size: int | None = None  # None: tp_size (plans made before the field existed)
    ep_size: int = 1
    pp_size: int = 1
    nnodes: int = 1
    moe_dense_tp_size: int | None = None
    # pipeline stages: (rank, start_layer, end_layer, weights GiB per rank, profiled tokens); the plan's other
    # sizes are the binding stage's, the one with the fewest tokens (every stage is cut to it)
    pp_stages: tuple[tuple[int, int, int, float, int], ...] = ()
    pp_binding_stage: int | None = None
    gpus_per_node: int | None = None  # the GPU system's (catalog), and its inter-node link
    scale_out: str | None = None
    # DeepSeek sparse attention (None otherwise)
    index_head_dim: int | None = None
    index_k_size_gib: float | None = None  # the index-K cache; SGLang's "KV size" includes it
    latent_row_bytes: int | None = None  # bytes per token per layer of the latent row
    mm_reservation_gib: float = 0.0  # multimodal embedding cache kept out of rest (mm_runtime_reservation_gb)
    notes: tuple[str, ...] = ()  # what poolsim assumed reading the model
    warnings: tuple[str, ...] = ()  # what SGLang logs as warnings for this configuration
    speculative: SpeculativePlan | None = None  # the draft's share (None: speculative decoding off)
    hicache: HiCachePlan | None = None  # --enable-hierarchical-cache: the host pools (pools/sizing/hicache.py)

    @property
    def is_hybrid(self) -> bool:
        return self.max_mamba_cache_size is not None

    @property
    def is_hybrid_swa(self) -> bool:
        return self.swa_pool == "hybrid"

    _MAMBA_KEYS = {"max_mamba_cache_size": "max_mamba_cache_size", "mamba_bytes_per_slot": "bytes_per_slot",
                   "conv_state_gib": "conv_state_gib", "ssm_state_gib": "ssm_state_gib",
                   "mamba_conv_shape": "conv_shape", "mamba_temporal_shape": "temporal_shape",
                   "mamba_conv_dtype": "conv_dtype", "mamba_ssm_dtype": "ssm_dtype", "mamba_ratio": "mamba_ratio",
                   "mamba_strategy": "strategy", "overlap_forced_off": "overlap_forced_off",
                   "linear_attn_kind": "kind", "linear_layer_ids": "layer_ids"}

    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout(tp=self.tp_size, attn_tp=self.attn_tp_size or self.tp_size, attn_dp=self.attn_dp_size,
                              ep=self.ep_size, pp=self.pp_size, nnodes=self.nnodes)

    @property
    def server_max_total_num_tokens(self) -> int:
        """KV tokens the whole server holds: each attention-DP group its own requests' (plain TP: every rank
        holds a shard, or for MLA a replica, of the same tokens)."""
        return self.max_total_num_tokens * self.attn_dp_size

    @property
    def server_max_running_requests(self) -> int:
        return self.max_running_requests * self.attn_dp_size

    def to_dict(self) -> dict:
        """Flat fields, with the hybrid ones nested under ``mamba`` (None for non-hybrid models) and the layout
        under ``parallel``."""
        d = {k: v for k, v in asdict(self).items() if k not in self._MAMBA_KEYS}
        d["parallel"] = self.layout.to_dict()
        d["server_max_total_num_tokens"] = self.server_max_total_num_tokens
        d["server_max_running_requests"] = self.server_max_running_requests
        d["mamba"] = ({out: getattr(self, k) for k, out in self._MAMBA_KEYS.items()} if self.is_hybrid else None)
        return d

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def make_kv_pool(self, device: str | None = None) -> KVCache:
        """The KV storage pool SGLang builds for this plan (buffers only on a torch device)."""
        size, page, dtype = self.max_total_num_tokens, self.page_size, self.kv_cache_dtype
        if self.is_hybrid_swa or self.index_head_dim is not None:
            raise PoolError(f"{self.model}: the simulator's device pools do not model SWA or DSA pools")
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
        from poolsim.pools.mem_cache.pool.mamba import MambaStateShape

        shape = MambaStateShape(conv=[tuple(s) for s in self.mamba_conv_shape], temporal=self.mamba_temporal_shape,
                                kind=self.linear_attn_kind)
        return MambaCacheParams(shape=shape, layers=list(self.linear_layer_ids), conv_dtype=self.mamba_conv_dtype,
                                ssm_dtype=self.mamba_ssm_dtype)

    def _layout_rows(self) -> list[tuple[str, str]]:
        """The ranks and what each holds, when the server is more than one plain TP group."""
        lay = self.layout
        if (lay.attn_dp == 1 and lay.ep == 1 and lay.pp == 1 and lay.nnodes == 1
                and self.moe_dense_tp_size in (None, lay.tp)):
            return []
        nodes = ([("nodes", f"{lay.nnodes} x {lay.gpus // lay.nnodes} GPUs (a node holds "
                            f"{self.gpus_per_node}); between nodes: {self.scale_out}")] if lay.nnodes > 1 else [])
        stages = [(f"  stage {r}" + (" (binds)" if r == self.pp_binding_stage else ""),
                   f"layers {a}-{b - 1}{' + embedding' if r == 0 else ''}"
                   f"{' + LM head' if r == lay.pp - 1 else ''}: {w:.2f} GiB weights per rank, {t:,} KV tokens "
                   "profiled") for r, a, b, w, t in self.pp_stages]
        experts = (f"routed experts 1/{lay.ep} of them at 1/{lay.tp // lay.ep} width" if lay.ep > 1
                   else f"routed experts 1/{lay.tp}")
        return [("layout", f"{lay.gpus} GPUs: tp {lay.tp} = {lay.attn_dp} attention-DP group"
                           f"{'s' if lay.attn_dp > 1 else ''} x attn_tp {lay.attn_tp}, one scheduler each "
                           f"(ep {lay.ep}, pp {lay.pp}, nnodes {lay.nnodes})"),
                ("each rank holds", f"attention and embedding 1/{lay.attn_tp}"
                                    + (f" (replicated {lay.attn_dp}x vs plain tp)" if lay.attn_dp > 1 else "")
                                    + f", LM head and shared experts 1/{lay.tp}, {experts}, dense MLP "
                                    f"1/{self.moe_dense_tp_size or lay.tp}; its DP group's KV and rows"
                                    + ("; its stage's layers" if lay.pp > 1 else "")), *stages, *nodes]

    def _speculative_rows(self) -> list[tuple[str, str]]:
        """The speculative block of ``MemoryPlan.table``."""
        sp = self.speculative
        auto = " (SGLang's auto choice)" if sp.auto_params else ""
        algo = sp.algorithm if sp.requested.upper() == sp.algorithm else f"{sp.algorithm} (as {sp.requested})"
        rows = [("speculative", f"{algo}: {sp.num_steps} steps, topk {sp.eagle_topk}, {sp.num_draft_tokens} draft "
                                f"tokens{auto}"),
                ("  draft", f"{sp.draft_model} ({sp.draft_architecture}{', NextN layers' if sp.nextn else ''}), "
                            f"{sp.draft_weights_gib:.2f} GiB weights per rank"),
                ("  draft KV pool", f"{sp.draft_pool_tokens:,} tokens x {sp.draft_cell_bytes:,} B over "
                                    f"{sp.draft_pool_layers} layers = {sp.draft_pool_gib:.2f} GiB"),
                ("  target's reservation", f"{sp.reserved_cell_bytes:,} B/token ({sp.draft_layers} draft layers); "
                                           f"target pool {self.max_total_num_tokens:,} tokens, "
                                           f"{sp.target_token_reduction:,} ({sp.target_token_reduction_frac:.2%}) "
                                           f"fewer than the {sp.target_tokens_without_draft:,} without it")]
        if sp.verify_buffer_reqs:
            rows.append(("  verify buffers", f"{sp.verify_buffers_gib:.2f} GiB of intermediate states for "
                                             f"{sp.verify_buffer_reqs} requests x {sp.num_draft_tokens} draft tokens"))
        rows.append(("  decode reservation", f"{sp.alloc_reserve_per_decode} slots per request (2 x "
                                             f"{sp.alloc_len_per_decode}); max_running_requests "
                                             f"{sp.max_running_requests}; req_to_token "
                                             f"+{sp.req_to_token_extra_context}"))
        if sp.accept_length is not None or sp.accept_file is not None:
            rows.append(("  acceptance", f"mean {sp.accept_length}" if sp.accept_length is not None
                                         else f"distribution from {sp.accept_file}"))
        rows += [("  note", n) for n in sp.notes]
        return rows

    def table(self, concurrency: list["Concurrency"] | None = None) -> str:
        """The plan as a compact human-readable table."""
        rows = [
            ("model / gpu / tp", f"{self.model} / {self.gpu} / {self.tp_size}"),
            *self._layout_rows(),
            ("attention", f"{self.attention_arch.upper()} via {self.attention_backend}, KV {self.kv_cache_dtype}, "
                          f"page {self.page_size}"),
            ("mem_fraction_static", f"{self.mem_fraction_static}"),
            ("chunked_prefill_size", f"{self.chunked_prefill_size if self.chunked_prefill_size else 'disabled'}"
                                     f" (max_prefill_tokens {self.max_prefill_tokens})"),
            ("GPU total / before weights", f"{self.gpu_total_gib:.2f} / {self.pre_model_load_gib:.2f} GiB "
                                           f"(runtime overhead {self.runtime_overhead_gib:.2f} GiB, assumed)"),
            ("weights per rank", f"{self.weights_gib_per_rank:.2f} GiB"),
            ("KV + state budget (rest)", f"{self.rest_gib:.2f} GiB; headroom {self.non_static_headroom_gib:.2f} GiB"
                                         + (f"; multimodal cache {self.mm_reservation_gib:.2f} GiB reserved"
                                            if self.mm_reservation_gib else "")),
            ("cell size", f"{self.cell_size_bytes:,} B/token over {self.kv_layer_num} KV layers"
                          + (f" (SWA layers weighted by swa_full_tokens_ratio {self.swa_full_tokens_ratio})"
                             if self.is_hybrid_swa else "")),
            ("max_total_num_tokens", f"{self.max_total_num_tokens:,}"
                                     + (f" per rank; whole server {self.server_max_total_num_tokens:,} "
                                        f"({self.attn_dp_size} DP groups, each its own requests)"
                                        if self.attn_dp_size > 1 else "")),
        ]
        if self.is_hybrid_swa:
            rows += [("sliding window", f"{self.sliding_window} tokens on {len(self.swa_layer_ids)} of "
                                        f"{self.kv_layer_num} layers: two pools (hybrid SWA)"),
                     ("SWA split", f"full_layer_tokens={self.full_max_total_num_tokens:,}, "
                                   f"swa_layer_tokens={self.swa_max_total_num_tokens:,}"),
                     ("Full KV pool", f"K size: {self.full_k_size_gib:.2f} GB, V size: {self.full_v_size_gib:.2f} GB"),
                     ("SWA KV pool", f"K size: {self.swa_k_size_gib:.2f} GB, V size: {self.swa_v_size_gib:.2f} GB"),
                     ("SWAKVPool mem usage", f"{self.kv_cache_gib:.2f} GB")]
        elif self.k_size_gib is not None:
            rows.append(("KV pool", f"K size: {self.k_size_gib:.2f} GB, V size: {self.v_size_gib:.2f} GB"))
        else:
            rows.append(("KV pool", f"KV size: {self.kv_size_gib:.2f} GB"))
        if self.swa_pool == "all-full":
            rows.append(("sliding window", f"{self.sliding_window} tokens on {len(self.swa_layer_ids)} layers, "
                                           "not used for sizing: one pool, every layer sized as full "
                                           "(off SGLang's hybrid-SWA list)"))
        if self.index_head_dim is not None:
            rows.append(("DSA index-K cache", f"{self.index_k_size_gib:.2f} GB (in KV size); latent "
                                              f"{self.latent_row_bytes} B + index {self.index_head_dim + 4} B "
                                              "per token per layer, page 64"))
        if self.is_hybrid:
            rows += [("mamba slots", f"{self.max_mamba_cache_size:,} x {self.mamba_bytes_per_slot:,} B "
                                     f"({self.linear_attn_kind}, {len(self.linear_layer_ids)} layers)"),
                     ("mamba pool", f"conv_state size: {self.conv_state_gib:.2f}GB, "
                                    f"ssm_state size: {self.ssm_state_gib:.2f}GB"),
                     ("mamba strategy", f"{self.mamba_strategy}, {self.mamba_ratio} slots per running request"
                                        + (", overlap scheduler forced off" if self.overlap_forced_off else ""))]
        rows += [("max_running_requests", f"{self.max_running_requests:,}"
                                          + (" (capped by mamba slots)" if self.rows_capped_by_mamba else "")
                                          + (f" per DP group; {self.server_max_running_requests:,} in all"
                                             if self.attn_dp_size > 1 else "")),
                 ("req_to_token table", f"{self.req_to_token_rows + 1:,} x {self.max_context_len:,} int32 = "
                                        f"{self.req_to_token_gib:.2f} GiB of {self.free_after_pools_gib:.2f} GiB free")]
        if self.speculative is not None:
            rows += self._speculative_rows()
        if self.hicache is not None:
            rows += self.hicache.table_rows()
        rows += [("note", n) for n in self.notes]
        rows += [("warning", w) for w in self.warnings]
        width = max(len(k) for k, _ in rows)
        out = [f"{k:<{width}}  {v}" for k, v in rows]
        if concurrency:
            out += ["", f"{'context len':>12}  {'max concurrency':>15}  {'KV limit':>10}  binds first"
                        + ("  (whole server)" if self.attn_dp_size > 1 else "")]
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


# ---- pools -------------------------------------------------------------------------------------


def make_kv_pool(model: ModelConfig, tp: int, size: int, page_size: int, dtype: str, gpu_arch: str = "sm90",
                 swa_full_tokens_ratio: float = 0.8) -> KVCache:
    """The KV storage pool SGLang builds (sizes only; no buffers without a device)."""
    return pool_configurator(model, tp, page_size, dtype, gpu_arch=gpu_arch,
                             swa_full_tokens_ratio=swa_full_tokens_ratio).kv_pool(size)


def resolve_max_num_reqs(token_capacity: int, context_len: int, max_running_requests: int | None,
                         max_mamba_cache_size: int | None = None, ratio: int = 1,
                         attn_dp: int = 1) -> tuple[int, bool]:
    """resolve_max_num_reqs (kv_cache_configurator.py:3119-3172), rows per attention-DP worker: a requested
    --max-running-requests is split over the groups (:3127-3128). Returns (rows, capped by mamba)."""
    estimated = int(token_capacity / context_len * 512)  # rows: 512 per context's worth of tokens
    estimated = max(min(estimated, 4096), 2048)  # rows: clamped to [2048, 4096]
    if max_running_requests is not None:
        max_num_reqs = min(max(1, max_running_requests // attn_dp), token_capacity // 2)
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


def validate_tp(model: ModelConfig, tp: int, attn_tp: int | None = None, moe_tp: int | None = None) -> None:
    """The tp divisibility asserts SGLang's model classes make (e.g. models/llama.py:183-193). ``attn_tp``: the
    attention-TP width under attention DP, which the attention heads must divide instead
    (models/deepseek_v2.py:2057, models/qwen3.py:166-177)."""
    if tp < 1:
        raise SizingError(f"--tp {tp} must be >= 1")
    heads, kv = model.num_attention_heads, model.num_key_value_heads
    atp = attn_tp or tp
    flag = f"--tp {tp}" if atp == tp else f"attention TP {atp} (--tp {tp} / --attn-dp-size {tp // atp})"
    if model.full_attention_layer_ids:
        if heads % atp:
            raise SizingError(f"{flag} does not divide num_attention_heads {heads}")
        if not model.use_mla and kv >= atp and kv % atp:
            raise SizingError(f"{flag} does not divide num_key_value_heads {kv}")
        if not model.use_mla and kv < atp and atp % kv:
            raise SizingError(f"{flag} is not a multiple of num_key_value_heads {kv}")
    swa = model.swa
    if swa is not None and model.swa_layer_ids and not model.use_mla:  # Gemma4Attention's asserts (:344-352)
        swa_heads, swa_kv = swa.num_attention_heads or heads, swa.num_key_value_heads
        if swa_heads % tp:
            raise SizingError(f"--tp {tp} does not divide the sliding-window layers' {swa_heads} attention heads")
        if (swa_kv >= tp and swa_kv % tp) or (swa_kv < tp and tp % swa_kv):
            raise SizingError(f"--tp {tp} and the sliding-window layers' {swa_kv} kv heads: one must divide the other")
    if model.linear_attn is not None and model.linear_attn.kind != "short_conv" and model.linear_attn.num_heads % tp:
        raise SizingError(f"--tp {tp} does not divide the {model.linear_attn.kind} heads {model.linear_attn.num_heads}")
    if model.quant_method == "fp8" and model.weight_block_size is not None and tp > 1:
        block_n = model.weight_block_size[0]
        for name, size, width in (("intermediate_size", model.intermediate_size, tp),
                                  ("moe_intermediate_size", model.moe.intermediate_size if model.moe else 0,
                                   moe_tp or tp)):  # the experts split over moe_tp = tp / ep
            if size and (size // width) % block_n:  # fp8.py validate_block_quant_shapes
                what = "tp" if width == tp else "moe_tp"
                raise SizingError(f"--tp {tp}: {name} {size} / {what} = {size // width} is not divisible by the "
                                  f"fp8 weight block {block_n}")


# ---- the plan ----------------------------------------------------------------------------------


def validate_gpu(model: ModelConfig, gpu: GPUSpec) -> None:
    """Expert storage SGLang picks by GPU (Kimi-K3's MXFP4 experts): an arch poolsim has no rule for is refused."""
    e = model.moe
    if e is not None and e.mxfp4_packed_archs is not None:
        known = set(e.mxfp4_packed_archs) | {"sm80", "sm89", "sm90"}
        if gpu.arch not in known:
            raise SizingError(f"{model.name} on {gpu.name} ({gpu.arch}): which MoE runner holds its MXFP4 experts "
                              f"there (quantization/mxfp4.py) is not modelled; poolsim sizes {', '.join(sorted(known))}")


def plan_memory(model: ModelConfig, gpu: GPUSpec, args: ServerArgs, *,
                runtime_overhead_gib: float | None = None) -> MemoryPlan:
    tp = args.tp_size
    layout = resolve_layout(model, args)
    attn_tp, attn_dp = layout.attn_tp, layout.attn_dp
    validate_tp(model, tp, attn_tp, moe_tp=tp // layout.ep)
    node_warning = check_nodes(layout, gpu)
    validate_gpu(model, gpu)
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
    kv_dtype = resolve_kv_cache_dtype(model, args.kv_cache_dtype, gpu)
    spec = resolve_speculative(model, args)
    if spec is not None and (attn_dp > 1 or layout.ep > 1):
        raise SizingError(f"--speculative-algorithm with --attn-dp-size {attn_dp} / --ep-size {layout.ep}: how the "
                          "draft's weights and pools shard under attention DP or EP is not modelled")
    max_running = args.max_running_requests  # as SGLang sizes with it: the EAGLE family's 48 when unset
    if spec is not None:
        _check_speculative_model(model, spec)
        if max_running is None:
            max_running = SPEC_MAX_RUNNING_REQUESTS  # speculative_hook.py:1086-1094
    if model.is_hybrid_swa and max_running is not None and args.disable_radix_cache and (
            args.chunked_prefill_size is None or args.chunked_prefill_size > 0):
        raise SizingError("--max-running-requests with --disable-radix-cache: SGLang sizes this hybrid-SWA model's "
                          "pool from the request cap (SWARequestCapPoolConfigurator), which poolsim does not model")

    strategy, disable_overlap, overlap_forced_off = (None, args.disable_overlap_schedule, False)
    if layout.pp > 1:  # "Pipeline parallelism is incompatible with overlap schedule" (overrides.py:1624-1628)
        disable_overlap = True
    if model.is_hybrid:
        strategy, disable_overlap, overlap_forced_off = resolve_mamba_strategy(model, gpu, args)
    extra_buffer = strategy in ("extra_buffer", "extra_buffer_lazy")
    backend, forced_page = resolve_attention_backend(model, gpu, args, kv_heads_per_rank(model, attn_tp),
                                                     extra_buffer)
    page_size = resolve_page_size(model, gpu, backend, forced_page or args.page_size)
    if model.is_hybrid:
        _validate_mamba_strategy(strategy, page_size, disable_overlap, args)
    if spec is not None:
        check_backend(spec, backend, page_size)

    chunked = args.chunked_prefill_size
    if chunked is None:
        chunked = default_chunked_prefill_size(gpu, tp)
    mem_fraction_static = args.mem_fraction_static
    if mem_fraction_static is None:
        mem_fraction_static = default_mem_fraction_static(model, gpu, args, chunked)
    if backend == "aiter" and context_len > 8192:
        mem_fraction_static = mem_fraction_static * 0.85  # attention_hook.py:244-268 (explicit values too)
    if attn_dp > 1:  # after the memory defaults: each DP group chunks its own prefill (parallel_hook.py:326-336)
        chunked = chunked // attn_dp
        if chunked == 0:
            raise SizingError(f"--chunked-prefill-size {args.chunked_prefill_size} // --attn-dp-size {attn_dp} = 0")

    # _profile_available_bytes, in SGLang's GiB floats
    overhead = default_runtime_overhead_gib(tp) if runtime_overhead_gib is None else runtime_overhead_gib
    gpu_total = gpu.total_bytes / GIB  # GiB
    pre_model_load = gpu_total - overhead  # GiB free when SGLang takes its baseline
    weights = weight_bytes_per_rank(model, layout, gpu.arch) / GIB  # GiB of weights on this rank
    draft_weights = 0.0
    if spec is not None:  # the draft is loaded before the target's pool is sized (scheduler.py:1077-1108)
        draft_weights = draft_weight_bytes(spec, tp, gpu.arch) / GIB
        weights += draft_weights
    pool_model, stage_rows, binding, layer_offset = model, (), None, 0
    if layout.pp > 1:  # each stage profiles its own layers; the pool is the minimum over them (:3108-3115)
        stages = pp_stages(model, layout, gpu.arch)
        stage_slack = pre_model_load * (1 - mem_fraction_static) + (
            MM_EMBEDDING_CACHE_MIB / 1024 if model.is_multimodal else 0.0)
        rows = []
        for st in stages:
            stage_rest = pre_model_load - st.weight_bytes / GIB - stage_slack
            if pre_model_load - st.weight_bytes / GIB <= 0:
                raise SizingError(f"--pp-size {layout.pp}: stage {st.rank} (layers {st.start_layer}-"
                                  f"{st.end_layer - 1}) needs {st.weight_bytes / GIB:.2f} GiB of weights per rank, "
                                  f"more than the {pre_model_load:.2f} GiB free on {gpu.name}")
            c = pool_configurator(st.model, attn_tp, page_size, kv_dtype, gpu_arch=gpu.arch,
                                  swa_full_tokens_ratio=args.swa_full_tokens_ratio)
            tokens = c.calculate_pool_sizes(int(stage_rest * (1 << 30))).max_total_num_tokens if stage_rest > 0 else 0
            rows.append((st.rank, st.start_layer, st.end_layer, st.weight_bytes / GIB, tokens))
        binding = min(range(len(rows)), key=lambda i: rows[i][4])  # the first of equals
        stage_rows, pool_model = tuple(rows), stages[binding].model
        weights, layer_offset = stages[binding].weight_bytes / GIB, stages[binding].start_layer
    available = pre_model_load - weights  # GiB free after loading weights
    slack = pre_model_load * (1 - mem_fraction_static)  # GiB kept for activations, graphs, req_to_token
    # mm_runtime_reservation_gb (kv_cache_configurator.py:202-219): a multimodal model keeps
    # SGLANG_VLM_CACHE_SIZE_MB (100, environ.py:1598) of the KV budget for its embedding cache
    mm_reserve = MM_EMBEDDING_CACHE_MIB / 1024 if model.is_multimodal else 0.0  # GiB
    rest = available - slack - mm_reserve  # GiB for KV (and mamba state)
    if available <= 0:
        raise SizingError(f"--tp {tp}: {model.name} weights need {weights:.2f} GiB per rank, more than the "
                          f"{pre_model_load:.2f} GiB free on {gpu.name}")
    if rest <= 0:
        minimum = 1 - available / pre_model_load  # kv_cache_configurator.py:3041-3060
        raise SizingError(f"--mem-fraction-static {mem_fraction_static}: weights ({weights:.2f} GiB per rank) leave "
                          f"no KV memory on {gpu.name}; raise it above {math.ceil(minimum * 1000) / 1000:.3f}")
    rest_before_mamba = rest

    mamba = None
    verify_bytes, verify_reqs = 0, 0
    ratio = mamba_ratio(strategy, disable_overlap) if model.is_hybrid else 1
    if model.is_hybrid:
        params = mamba_cache_params(model, tp, args.mamba_ssm_dtype)
        per_slot = params.mamba_cache_per_req  # B over all linear layers
        draft_tokens = spec.num_draft_tokens if spec is not None else None
        if args.max_mamba_cache_size is not None:
            source, max_mamba = "--max-mamba-cache-size", args.max_mamba_cache_size  # // dp
            if draft_tokens:  # kv_cache_configurator.py:3310-3323
                verify_reqs = spec_verify_reqs(max_mamba, ratio, max_running)
                verify_bytes = spec_verify_state_bytes(per_slot, draft_tokens, max_mamba, ratio, max_running)
                rest = rest - verify_bytes / (1 << 30)
        elif args.disable_radix_cache and max_running is not None:
            source, max_mamba = "--max-running-requests", max(1, max_running)
            if draft_tokens:  # kv_cache_configurator.py:3336-3344: every slot's buffers
                verify_reqs = max_mamba
                verify_bytes = per_slot * (max_mamba + 1) * draft_tokens
                rest = rest - verify_bytes / (1 << 30)
        else:
            source = "--mamba-full-memory-ratio"
            max_mamba, _ = split_mamba_budget(rest, per_slot, args.mamba_full_memory_ratio, draft_tokens, ratio,
                                              max_running)
            if draft_tokens and max_mamba > 0:
                verify_reqs = spec_verify_reqs(max_mamba, ratio, max_running)
                verify_bytes = spec_verify_state_bytes(per_slot, draft_tokens, max_mamba, ratio, max_running)
                rest = rest - verify_bytes / (1 << 30)
        if max_mamba <= 0:
            raise SizingError(f"max_mamba_cache_size {max_mamba}: rest {rest:.2f} GiB holds no "
                              f"{per_slot / 2**20:.2f} MiB state slot; raise --mem-fraction-static"
                              + (" or lower --speculative-num-draft-tokens" if draft_tokens else ""))
        rest = rest - _mamba_state_gib(max_mamba, per_slot)
        if rest <= 0:
            raise SizingError(f"{source}: max_mamba_cache_size {max_mamba} needs {max_mamba + 1} slots of "
                              f"{per_slot / 2**20:.2f} MiB, more than the {rest_before_mamba:.2f} GiB budget")
        mamba = (params, per_slot, max_mamba)

    available_bytes = int(rest * (1 << 30))  # B, as _profile_available_bytes returns
    warnings = [node_warning] if node_warning else []
    draft_layers = spec.budget_draft_layers if spec is not None else 0
    # KV heads per rank: get_num_kv_heads(attn_tp) (kv_cache_configurator.py:1047-1048)
    conf = pool_configurator(pool_model, attn_tp, page_size, kv_dtype, gpu_arch=gpu.arch,
                             swa_full_tokens_ratio=args.swa_full_tokens_ratio, draft_layers=draft_layers)
    cell = conf.target_cell_size()  # B per token of the target's pool (float for hybrid SWA)
    sizes = conf.calculate_pool_sizes(available_bytes)  # divides by the target's cell plus the draft's share
    profiled = sizes.max_total_num_tokens  # tokens, page-floored
    if args.max_total_tokens is not None:
        if args.max_total_tokens > profiled:  # kv_cache_configurator.py:3101-3106
            warnings.append(f"max_total_tokens={args.max_total_tokens} is larger than the profiled value "
                            f"{profiled}. Use the profiled value instead.")
        sizes = conf.from_max_tokens(min(profiled, args.max_total_tokens))
    max_total_num_tokens = sizes.max_total_num_tokens
    if max_total_num_tokens <= 0:
        raise SizingError(f"max_total_num_tokens {max_total_num_tokens}: {rest:.2f} GiB holds no page of "
                          f"{page_size} tokens x {cell} B; raise --mem-fraction-static")

    max_reqs, capped = resolve_max_num_reqs(max_total_num_tokens, context_len, max_running,
                                            mamba[2] if mamba else None, ratio, attn_dp)
    if max_reqs < 1:  # one rule for plan and run: a pool too small for a single request row
        raise SizingError(f"--max-total-tokens {args.max_total_tokens}: {max_total_num_tokens} KV tokens give "
                          f"{max_total_num_tokens} // 2 = 0 request rows; a server needs at least one")
    if capped:  # kv_cache_configurator.py:3140-3156
        warnings.append(f"max_running_requests is capped to {max_reqs} by the mamba state cache "
                        f"(max_mamba_cache_size={mamba[2]}, {ratio} state slots per request)")
    elif max_running is not None and max_reqs < max(1, max_running // attn_dp):
        requested = max(1, max_running // attn_dp)
        warnings.append(f"max_running_requests was reduced from the requested {requested} to "
                        f"{max_reqs} " + ("(per dp worker) " if attn_dp > 1 else "")
                        + "due to the available KV cache capacity")
    if max_total_num_tokens < context_len:  # tp_worker.py:555-566
        warnings.append(f"KV pool holds {max_total_num_tokens} tokens, fewer than --context-length {context_len}. "
                        "One full-length request cannot fit.")

    kv_pool = conf.kv_pool(max_total_num_tokens, sizes.swa_max_total_num_tokens)
    kv_sizes = kv_pool.get_kv_size_bytes()  # B with size + page_size rows per layer
    kv_total = sum(kv_sizes) if isinstance(kv_sizes, tuple) else kv_sizes
    window_fields = _window_fields(model, kv_pool, args) if model.swa is not None else {}
    if model.dsa is not None:
        window_fields = dict(index_head_dim=model.dsa.index_head_dim, index_k_size_gib=kv_pool.index_k_size_bytes() / GIB,
                             latent_row_bytes=kv_pool.latent_row_bytes)
    extra_context = spec.req_to_token_extra_context(page_size) if spec is not None else REQ_TO_TOKEN_EXTRA_CONTEXT
    max_context_len = context_len + extra_context  # tokens per req_to_token row
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
    spec_plan = None
    draft_total = 0
    if spec is not None:
        # the same budget without the draft's share (and the same --max-total-tokens cap)
        alone_conf = pool_configurator(model, tp, page_size, kv_dtype, gpu_arch=gpu.arch,
                                       swa_full_tokens_ratio=args.swa_full_tokens_ratio)
        alone = alone_conf.calculate_pool_sizes(available_bytes).max_total_num_tokens
        if args.max_total_tokens is not None:
            alone = alone_conf.from_max_tokens(min(alone, args.max_total_tokens)).max_total_num_tokens
        spec_plan = _speculative_plan(spec, model, conf, alone, max_total_num_tokens, page_size, kv_dtype, tp,
                                      gpu.arch, draft_weights, verify_bytes, verify_reqs, max_reqs)
        draft_total = int(round(spec_plan.draft_pool_gib * GIB)) + verify_bytes
    # GiB free once the pools exist (the draft's pool and the verify buffers too)
    free_after_pools = available - (kv_total + mamba_total + draft_total) / GIB
    if req_to_token_bytes / GIB > free_after_pools:
        raise SizingError(f"--context-length {context_len}: the req_to_token table ({max_reqs + 1} rows x "
                          f"{max_context_len} int32 = {req_to_token_bytes / GIB:.2f} GiB) "
                          f"exceeds the {free_after_pools:.2f} GiB left after the pools; lower --context-length "
                          "or --max-running-requests")
    max_req_len = min(context_len - 1, max_total_num_tokens - 1)  # tp_worker.py:568-571
    hicache = None
    if args.enable_hierarchical_cache:  # the host pools, after the device pools (mem_cache/kv_cache_builder.py:456)
        if spec is not None or layout.pp > 1:
            raise SizingError("--enable-hierarchical-cache with " + ("speculative decoding" if spec is not None else
                              "--pp-size > 1") + ": the draft's or the stages' host pools are not modelled")
        ranks = tp * args.dp_size * layout.pp // layout.nnodes  # ranks_per_host (pool_host/base.py:68-81)
        hicache, host_warnings = plan_hicache(args, gpu, kv_pool, MambaPool(mamba[2], mamba[0]) if mamba else None,
                                              model.name, is_swa=isinstance(kv_pool, SWAKVPool),
                                              is_dsa=model.dsa is not None, ranks_per_host=ranks)
        warnings += host_warnings

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
        cell_size_bytes=cell, kv_layer_num=len(pool_model.full_attention_layer_ids),
        kv_head_num=1 if model.use_mla else kv_heads_per_rank(model, attn_tp),
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
        full_attention_layer_ids=tuple(i + layer_offset for i in getattr(conf, "full_layer_ids",
                                                                          pool_model.full_attention_layer_ids)),
        attn_dp_size=attn_dp, attn_tp_size=attn_tp, moe_dense_tp_size=args.moe_dense_tp_size, ep_size=layout.ep,
        pp_size=layout.pp, nnodes=layout.nnodes, pp_stages=stage_rows, pp_binding_stage=binding,
        gpus_per_node=gpu.gpus_per_node, scale_out=gpu.scale_out,
        disable_overlap_schedule=disable_overlap, mm_reservation_gib=mm_reserve, notes=model.notes,
        warnings=tuple(warnings), **hybrid_fields, **window_fields, speculative=spec_plan, hicache=hicache)


def _check_speculative_model(model: ModelConfig, spec: SpeculativeConfig) -> None:
    """What poolsim sizes of a draft: SGLang's hybrid-SWA MTP drafts (own windowed layers, per-depth pools) are
    not modelled."""
    if model.is_hybrid_swa and spec.nextn:
        raise SizingError(f"--speculative-algorithm {spec.requested} on {model.name}: the MTP draft of a hybrid-SWA "
                          "model (its own windowed layers) is not modelled; an EAGLE3 draft is")


def _draft_kv_pool(spec: SpeculativeConfig, target: ModelConfig, size: int, page_size: int, kv_dtype: str, tp: int,
                   gpu_arch: str):
    """The draft worker's own KV pool: its geometry over its layers, the target's token count. A NextN draft is
    the target's attention, so its pool is the target's kind; an EAGLE/STANDALONE draft is MHA or MLA as its
    config says (the draft's KV dtype follows --kv-cache-dtype, spec.py:151-164)."""
    from dataclasses import replace as _replace

    from poolsim.pools.model.config import LayerSpec

    draft = spec.draft
    layers = tuple(LayerSpec("attention", "dense") for _ in range(spec.draft_pool_layers))
    geometry = _replace(target if spec.nextn else draft, layers=layers, linear_attn=None, swa=None,
                        mamba_ssm_dtype=None, dsa=(target.dsa if spec.nextn else draft.dsa))
    return pool_configurator(geometry, tp, page_size, kv_dtype, gpu_arch=gpu_arch).kv_pool(size)


def _speculative_plan(spec: SpeculativeConfig, model: ModelConfig, conf, alone: int, tokens: int, page_size: int,
                      kv_dtype: str, tp: int, gpu_arch: str, draft_weights_gib: float, verify_bytes: int,
                      verify_reqs: int, max_reqs: int) -> SpeculativePlan:
    """``tokens``: the target's pool (the draft's has as many); ``alone``: the target's without the reservation."""
    pool = _draft_kv_pool(spec, model, tokens, page_size, kv_dtype, tp, gpu_arch)
    kv = pool.get_kv_size_bytes()
    kv = sum(kv) if isinstance(kv, tuple) else kv
    reduction = alone - tokens
    return SpeculativePlan(
        algorithm=spec.algorithm, requested=spec.requested, num_steps=spec.num_steps, eagle_topk=spec.eagle_topk,
        num_draft_tokens=spec.num_draft_tokens, auto_params=spec.auto_params, draft_model=spec.draft.name,
        draft_architecture=spec.draft.architecture, draft_source=spec.draft_source, nextn=spec.nextn,
        draft_layers=spec.budget_draft_layers, draft_pool_layers=spec.draft_pool_layers,
        draft_cell_bytes=int(pool.cell_size_bytes()), reserved_cell_bytes=int(conf.draft_cell_size()),
        draft_pool_tokens=tokens, draft_pool_gib=kv / GIB, draft_weights_gib=draft_weights_gib,
        target_tokens_without_draft=alone, target_token_reduction=reduction,
        target_token_reduction_frac=reduction / alone if alone else 0.0,
        verify_buffers_gib=verify_bytes / GIB, verify_buffer_reqs=verify_reqs, max_running_requests=max_reqs,
        alloc_len_per_decode=spec.alloc_len_per_decode(page_size),
        alloc_reserve_per_decode=spec.alloc_reserve_per_decode(page_size),
        req_to_token_extra_context=spec.req_to_token_extra_context(page_size),
        accept_length=spec.accept_length, accept_file=spec.accept_file, notes=spec.notes)


def _window_fields(model: ModelConfig, kv_pool: KVCache, args: ServerArgs) -> dict:
    """What a plan reports about the sliding window: both pools as SGLang logs them, or that it is unused."""
    out = dict(sliding_window=model.sliding_window, swa_layer_ids=tuple(model.swa_layer_ids))
    if not isinstance(kv_pool, SWAKVPool):
        return dict(out, swa_pool="all-full")
    full, swa = kv_pool.full_kv_pool, kv_pool.swa_kv_pool
    (fk, fv), (sk, sv) = full.get_kv_size_bytes(), swa.get_kv_size_bytes()
    return dict(out, swa_pool="hybrid", swa_full_tokens_ratio=args.swa_full_tokens_ratio,
                full_max_total_num_tokens=full.size, swa_max_total_num_tokens=swa.size,
                full_k_size_gib=fk / GIB, full_v_size_gib=fv / GIB, swa_k_size_gib=sk / GIB, swa_v_size_gib=sv / GIB,
                swa_kv_head_num=swa.head_num, swa_head_dim=swa.head_dim, swa_v_head_dim=swa.v_head_dim)


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


# ---- capacity at a context length ----------------------------------------------------------------


def max_concurrency(plan: MemoryPlan, context_lens: list[int]) -> list[Concurrency]:
    """How many requests of each total length fit at once in the whole server, and which pool runs out first.

    KV: whole pages per request (ceil_page(L)). Rows: max_running_requests, which for hybrids already
    counts ``mamba_ratio`` state slots per request; when that cap bound the rows, mamba slots bind.
    """
    out = []
    rows = plan.max_running_requests
    for length in context_lens:
        if length > plan.max_req_len + 1:
            out.append(Concurrency(length, 0, 0, rows * plan.attn_dp_size, "context_len"))
            continue
        pages = -(-length // plan.page_size) * plan.page_size  # tokens held, page-rounded
        kv_limit = plan.max_total_num_tokens // pages
        if plan.is_hybrid_swa:  # the SWA pool holds about the last window (+ a page) of each request
            kv_limit = min(kv_limit, plan.swa_max_total_num_tokens // _swa_tokens_per_request(plan, length))
        if kv_limit < rows:
            binding = "kv_tokens"
        else:
            binding = "mamba_slots" if plan.rows_capped_by_mamba else "request_rows"
        dp = plan.attn_dp_size  # the whole server: each attention-DP group holds its own requests
        out.append(Concurrency(length, min(kv_limit, rows) * dp, kv_limit * dp, rows * dp, binding))
    return out


def _swa_tokens_per_request(plan: MemoryPlan, context_len: int) -> int:
    """SWA tokens a request keeps: min(length, window) page-rounded, plus the page SGLang's admission
    reserves (mem_cache/prefill_budget.py:27-60); out-of-window tokens are released."""
    held = min(context_len, plan.sliding_window)
    return -(-held // plan.page_size) * plan.page_size + plan.page_size


def bytes_per_request(plan: MemoryPlan, context_len: int) -> int:
    """KV of ``context_len`` tokens (page-rounded) plus one state slot for hybrids, on one rank; for hybrid
    SWA, the full layers hold every token and the SWA layers about the last window."""
    pages = -(-context_len // plan.page_size) * plan.page_size
    if plan.is_hybrid_swa:
        full_layers = len(plan.full_attention_layer_ids)
        full_tok = plan.kv_head_num * (plan.head_dim + plan.v_head_dim) * full_layers
        swa_tok = plan.swa_kv_head_num * (plan.swa_head_dim + plan.swa_v_head_dim) * len(plan.swa_layer_ids)
        width = dtype_bytes(plan.kv_cache_dtype)
        return (pages * full_tok + _swa_tokens_per_request(plan, context_len) * swa_tok) * width
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
