"""The mamba state pool's sizing term (``kv_cache_configurator.py`` ``_handle_max_mamba_cache``,
``_calculate_mamba_ratio``; ``overrides.py`` ``_mamba_radix_cache_resolution``): per-slot state bytes,
the slots taken out of the budget, and how many a running request may hold.
"""

from __future__ import annotations

from poolsim.pools.errors import PoolError, SizingError
from poolsim.pools.hardware.gpu_catalog import GPUSpec
from poolsim.pools.mem_cache.pool.mamba import MambaCacheParams
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.server_args import ServerArgs

MAMBA_BASE_RATIO = 3  # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO, kv_cache_configurator.py:234
MAMBA_CONV_DTYPE = "bfloat16"  # SGLANG_MAMBA_CONV_DTYPE default, environ.py:1628
MAMBA_EXTRA_BUFFER_ARCHS = {"KimiLinearForCausalLM", "KimiK3ForConditionalGeneration",  # overrides.py:402-432
                            "Qwen3NextForCausalLM", "NemotronHForCausalLM",
                            "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
                            "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "GraniteMoeHybridForCausalLM"}
MAMBA_STRATEGIES = ("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")
MAMBA_SSM_DTYPES = ("float32", "bfloat16", "float16")


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


def split_mamba_budget(rest_gib: float, per_slot_bytes: int, mamba_full_memory_ratio: float,
                       spec_draft_tokens: int | None = None, ratio: int = 1,
                       max_running_requests: int | None = None) -> tuple[int, float]:
    """The default branch of _handle_max_mamba_cache (kv_cache_configurator.py:3345-3409).

    Returns (max_mamba_cache_size, rest_gib left for KV). Float GiB arithmetic in SGLang's order. With speculative
    decoding (``spec_draft_tokens`` D) the slots and the verify buffers are solved together (:3356-3376):
    ``K = int((budget - per_req (1 + D)) // (per_req (1 + D / ratio)))``, and the buffers of
    ``min(max_running_requests, K // ratio) + 1`` requests, ``per_req x D`` each, leave the budget too.
    """
    r = mamba_full_memory_ratio
    mamba_budget = rest_gib * r / (1 + r)  # GiB: r/(1+r) of rest goes to state
    mamba_budget_bytes = mamba_budget * (1 << 30)  # B
    if spec_draft_tokens:
        d = spec_draft_tokens
        max_mamba_cache_size = int((mamba_budget_bytes - per_slot_bytes * (1 + d))
                                   // (per_slot_bytes * (1 + d / ratio)))
        rest_gib = rest_gib - spec_verify_state_bytes(per_slot_bytes, d, max_mamba_cache_size, ratio,
                                                      max_running_requests) / (1 << 30)
        return max_mamba_cache_size, rest_gib - _mamba_state_gib(max_mamba_cache_size, per_slot_bytes)
    # slots: floor(budget / slot) - 1, the padding slot paid for
    max_mamba_cache_size = int((mamba_budget_bytes - per_slot_bytes) // per_slot_bytes)
    return max_mamba_cache_size, rest_gib - _mamba_state_gib(max_mamba_cache_size, per_slot_bytes)


def spec_verify_reqs(max_mamba_cache_size: int, ratio: int, max_running_requests: int | None) -> int:
    """The requests whose verify buffers SGLang reserves: min(max(1, max_running_requests), slots // ratio)."""
    return min(max(1, max_running_requests or 1), max_mamba_cache_size // ratio)


def spec_verify_state_bytes(per_slot_bytes: int, draft_tokens: int, max_mamba_cache_size: int, ratio: int,
                            max_running_requests: int | None) -> int:
    """The intermediate SSM and conv-window states a verify pass writes, as SGLang budgets them:
    ``per_req x (capped_reqs + 1) x D`` (kv_cache_configurator.py:3305-3323, :3366-3376)."""
    capped = spec_verify_reqs(max_mamba_cache_size, ratio, max_running_requests)
    return per_slot_bytes * (capped + 1) * draft_tokens


def _mamba_state_gib(max_mamba_cache_size: int, per_slot_bytes: int) -> float:
    return (max_mamba_cache_size + 1) * per_slot_bytes / (1 << 30)  # GiB, slot 0 included


def _validate_mamba_strategy(strategy: str, page_size: int, disable_overlap: bool, args: ServerArgs) -> None:
    """validate_mamba_no_buffer / validate_mamba_extra_buffer (arg_groups/mamba_hook.py:115-175)."""
    if strategy == "no_buffer":
        if page_size != 1:
            raise SizingError(f"--mamba-radix-cache-strategy no_buffer needs page_size 1, got {page_size}")
        if not disable_overlap:
            raise SizingError("--mamba-radix-cache-strategy no_buffer needs --disable-overlap-schedule")
    if strategy in ("extra_buffer", "extra_buffer_lazy") and args.mamba_track_interval % page_size:
        raise SizingError(f"--page-size {page_size} does not divide mamba_track_interval {args.mamba_track_interval}")
