"""What SGLang 0.5.23 resolves before it sizes anything: the defaults it derives from the GPU
(``arg_groups/memory_hook.py``), the attention backend and page size its model overrides and backend
constraints pick (``arg_groups/model_overrides/``, ``overrides.py``), and the KV cache dtype.
"""

from __future__ import annotations

from poolsim.pools.errors import SizingError
from poolsim.pools.hardware.gpu_catalog import GPUSpec
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.pool_configurator import kv_heads_per_rank as heads_per_rank
from poolsim.pools.sizing.server_args import ServerArgs

# CUDA context + NCCL/distributed init before SGLang takes its baseline; cannot be measured here.
# tp=1: H100 80GB, 81559 MiB = 79.65 GiB total, SGLang logs "Load weight begin. avail mem=78.43 GB"
#       (Llama-3.1-8B, 2026-02 SGLang docs CI log) -> 1.22 GiB.
# tp>1: H200, 143771 MiB = 140.40 GiB, "avail mem=137.29 GB" on TP ranks 1-6 at tp=8
#       (sgl-project/sglang#11716 log; "Init torch distributed ends. mem usage=2.01 GB") -> 3.11 GiB.
RUNTIME_OVERHEAD_GIB_TP1 = 1.22
RUNTIME_OVERHEAD_GIB_MULTI_GPU = 3.11

# SGLang 0.5.23's --attention-backend choices (arg_groups/choices.py:69-101); argparse refuses anything else.
ATTENTION_BACKENDS = ("triton", "torch_native", "flex_attention", "dsa", "nsa", "qsa", "dsv4", "compressed", "fa3",
                      "fa4", "flashinfer", "llada2_cfg_flashinfer", "flashmla", "trtllm_mla", "cutedsl_mla",
                      "tokenspeed_mla", "trtllm_mha", "hpc_ops", "minicpm_flashattn", "minicpm_flashinfer", "aiter",
                      "wave", "intel_amx", "ascend", "intel_xpu")
KV_CACHE_DTYPES = {"auto": None, "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16",
                   "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}

GEMMA4_ARCHS = {"Gemma4ForConditionalGeneration", "Gemma4ForCausalLM"}
LLAMA4_ARCHS = {"Llama4ForConditionalGeneration", "Llama4ForCausalLM"}
QWEN3_5_HYBRID_ARCHS = {"Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration",  # model_overrides/qwen3_5.py:17
                        "Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"}


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
    reserved += tp * args.pp_size / 8 * 1024  # MiB: tp * pp / 8 GiB for large parallel sizes (memory_hook.py:312)
    reserved += _reserve_for_graph_mib(model, gpu, args, decode_max_bs, chunked_prefill_size)  # MiB
    if gpu_mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)  # MiB: a 10 GiB floor on big cards
    fraction = round((gpu_mem - reserved) / gpu_mem, 3)
    if model.is_multimodal and model.vit_size is not None:
        fraction = fraction * vlm_mem_fraction_factor(*model.vit_size)  # memory_hook.py:330-337
    return fraction


def vlm_mem_fraction_factor(vit_layers: int, vit_hidden: int) -> float:
    """adjust_mem_fraction_for_vlm (memory_hook.py:417-465): 0.95, times 10 % less per 100 % more ViT weight than
    ViT-L/14 (24 layers of 1024), clamped to [0.8, 1.05]."""
    ratio = vit_layers * vit_hidden**2 / (24 * 1024**2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def prefill_cuda_graph_on(model: ModelConfig, gpu: GPUSpec, args: ServerArgs) -> bool:
    # breakable prefill graphs are the CUDA default (cuda_graph_config.py:119); KDA models turn them
    # off (cuda_graph_hook.py:183-191), so do multimodal models off the breakable-graph allowlist
    # (:229-237; Gemma 4), and so does --disable-prefill-cuda-graph
    return gpu.vendor == "nvidia" and not args.disable_cuda_graph and not args.disable_prefill_cuda_graph and not (
        model.linear_attn is not None and model.linear_attn.kind == "kda") and not (
        model.is_multimodal and not model.multimodal_prefill_graph)


def _reserve_for_graph_mib(model, gpu, args, decode_max_bs: int, chunked_prefill_size: int) -> float:
    """reserve_for_graph_mb (memory_hook.py:292-332)."""
    reserved = 0.0
    if not args.disable_cuda_graph:
        reserved += decode_max_bs * 2  # MiB: decode graphs
    if args.attn_dp_size > 1:  # memory_hook.py:370-378: DP attention's padding, MiB
        reserved += decode_max_bs * args.attn_dp_size * 3
        if decode_max_bs > 300:
            reserved += decode_max_bs * args.attn_dp_size * 1.5
    if prefill_cuda_graph_on(model, gpu, args):
        if model.use_mla:
            reserved += 1.5 * 1024  # MiB: MLA prefill graph overhead
        else:
            max_bs = chunked_prefill_size
            if args.pp_size > 1:  # PP captures up to 8192 tokens (memory_hook.py:243-250, :25)
                max_bs = min(max_bs, 8192)
            if args.max_total_tokens is not None:
                max_bs = min(max_bs, args.max_total_tokens)
            reserved += len(prefill_cuda_graph_bs(max_bs)) * 8  # MiB per captured prefill size
    return reserved


def resolve_attention_backend(model: ModelConfig, gpu: GPUSpec, args: ServerArgs, kv_heads_per_rank: int,
                              extra_buffer: bool) -> tuple[str, int | None]:
    """(backend, page size a model override forces or None): get_default_attn_backend
    (model_override_base.py:277) plus the DeepSeek, Qwen3-Next and Nemotron-H sm100 overrides."""
    if args.attention_backend is not None and args.attention_backend not in ATTENTION_BACKENDS:
        raise SizingError(f"--attention-backend {args.attention_backend!r} is not one of "
                          f"{', '.join(ATTENTION_BACKENDS)}")
    if model.dsa is not None:
        # model_overrides/deepseek_v2.py:99-172: the dsa backend and 64-token pages (index_kpool 1)
        return args.attention_backend or "dsa", 64
    if args.attention_backend is not None:
        backend = args.attention_backend
    elif model.architecture in GEMMA4_ARCHS:  # model_overrides/gemma4.py:30-44
        backend = "trtllm_mha" if gpu.arch == "sm100" else "triton"
    elif model.architecture in LLAMA4_ARCHS or model.architecture == "GptOssForCausalLM":
        # model_overrides/llama4.py:22-37, model_overrides/gpt_oss.py
        backend = {"sm100": "trtllm_mha", "sm90": "fa3", "gfx942": "aiter"}.get(gpu.arch, "triton")
    elif gpu.arch == "sm100" and model.architecture in ("Lfm2ForCausalLM", "GraniteMoeHybridForCausalLM"):
        backend = "flashinfer"  # model_overrides/lfm2.py, granitemoehybrid.py (Granite: with mamba layers)
    elif gpu.arch == "sm100" and model.architecture == "KimiK3ForConditionalGeneration":
        backend = "trtllm_mla"  # model_overrides/kimi_k3.py:122-135 (prefill and decode)
    elif gpu.arch == "sm100" and model.architecture == "DeepseekV3ForCausalLM":
        backend = "trtllm_mla"  # arg_groups/model_overrides/deepseek_v2.py:176-186
    elif gpu.arch == "sm100" and model.architecture in QWEN3_5_HYBRID_ARCHS:
        # model_overrides/qwen3_5.py:24-48: trtllm_mha at page 64 when the default backend is trtllm_mha, unless
        # the radix cache runs without the extra buffer and without speculation (then page 1 and triton)
        no_buffer_radix = not extra_buffer and not args.disable_radix_cache and args.speculative_algorithm is None
        trtllm = _mha_default_backend(model, gpu, args) == "trtllm_mha"
        return ("trtllm_mha", 64) if trtllm and not no_buffer_radix else ("triton", 1)
    elif gpu.arch == "sm100" and model.architecture == "NemotronHForCausalLM":
        backend = "trtllm_mha"  # model_overrides/nemotron_h.py:142-143
    elif not model.use_mla:
        backend = _mha_default_backend(model, gpu, args)
    else:
        backend = {"sm90": "fa3", "sm100": "flashinfer"}.get(gpu.arch, "triton")
        if gpu.arch == "gfx942":
            backend = "aiter" if kv_heads_per_rank in (16, 128) else "triton"
    if backend == "fa3" and args.kv_cache_dtype == "fp8_e5m2":
        backend = "triton"  # overrides.py:1272-1280
    return backend, None


def _mha_default_backend(model: ModelConfig, gpu: GPUSpec, args: ServerArgs) -> str:
    """get_default_attn_backend for MHA (model_override_base.py:300-330). It runs before the speculative hook, so
    it sees the flags as given: fa3 on Hopper and trtllm_mha/fa4 on Blackwell need topk unset, or 1 at page 1
    (is_no_spec_infer_or_topk_one, utils/common.py:3960-3966); Blackwell's also needs speculation off or topk
    given. Otherwise FlashInfer."""
    topk = args.speculative_eagle_topk
    no_spec_or_topk_one = topk is None or (topk == 1 and args.page_size == 1)
    if gpu.arch == "sm90":
        return "fa3" if no_spec_or_topk_one else "flashinfer"
    if gpu.arch == "sm100":
        if no_spec_or_topk_one and (args.speculative_algorithm is None or topk is not None):
            return "fa4" if model.head_dim != model.v_head_dim else "trtllm_mha"
        return "flashinfer"
    return {"gfx942": "aiter"}.get(gpu.arch, "flashinfer")


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


def resolve_kv_cache_dtype(model: ModelConfig, kv_cache_dtype: str, gpu: GPUSpec | None = None) -> str:
    """configure_kv_cache_dtype (mem_cache/kv_cache_dtype.py:34): auto = the model dtype (fp8 when the
    checkpoint's quantization_config declares an FP8 KV cache). DSA models: _dsa_kv_cache_dtype_default
    (overrides.py:491-546), auto = fp8_e4m3 on sm100 and bfloat16 below; nothing else is allowed."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise SizingError(f"--kv-cache-dtype {kv_cache_dtype!r} is not one of {', '.join(KV_CACHE_DTYPES)}")
    if model.dsa is not None:
        if kv_cache_dtype == "auto":
            return "fp8_e4m3" if gpu is not None and gpu.arch == "sm100" else "bfloat16"
        if KV_CACHE_DTYPES[kv_cache_dtype] not in ("bfloat16", "fp8_e4m3"):
            raise SizingError(f"--kv-cache-dtype {kv_cache_dtype}: DeepSeek DSA supports only bfloat16 or fp8_e4m3")
        return KV_CACHE_DTYPES[kv_cache_dtype]
    if kv_cache_dtype == "auto":
        return "fp8_e4m3" if model.kv_cache_quant_fp8 else model.dtype
    return KV_CACHE_DTYPES[kv_cache_dtype]


def kv_heads_per_rank(model: ModelConfig, tp: int) -> int:
    """get_num_kv_heads (configs/model_config.py:1700): max(1, kv_heads // tp)."""
    return heads_per_rank(model.num_key_value_heads, tp)
