"""The subset of SGLang's ``ServerArgs`` that decides memory and scheduling, with SGLang's names and defaults.

``None`` means "let SGLang pick", exactly as an unset server flag does; ``pools.sizing.plan`` resolves
those defaults (``mem_fraction_static``, ``chunked_prefill_size``, ``max_running_requests``, ...).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import NamedTuple


@dataclass(frozen=True)
class ServerArgs:
    tp_size: int = 1
    dp_size: int = 1
    attn_dp_size: int = 1  # attention-DP groups inside the TP group (pools/sizing/parallel.py)
    moe_dense_tp_size: int | None = None  # None: tp; 1 replicates the dense MLP (DeepSeek family)
    ep_size: int = 1  # expert parallelism inside the TP group
    pp_size: int = 1  # pipeline stages, each a TP group of tp GPUs over its share of the layers
    nnodes: int = 1  # nodes the tp * pp GPUs span
    moe_a2a_backend: str = "none"  # none only: poolsim does not size the all-to-all backends' buffers
    page_size: int = 1
    mem_fraction_static: float | None = None
    kv_cache_dtype: str = "auto"  # auto | bfloat16 | float16 | fp8_e4m3 | fp8_e5m2
    context_length: int | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int | None = None  # None: by GPU memory; -1 disables chunking
    schedule_policy: str = "fcfs"  # fcfs | lpm
    schedule_conservativeness: float = 1.0
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    enable_mixed_chunk: bool = False
    scheduler_recv_interval: int = 1  # read new requests every N event-loop iterations while decoding
    attention_backend: str | None = None  # None: SGLang's default for the GPU (fa3 on Hopper, ...)
    disable_cuda_graph: bool = False
    disable_prefill_cuda_graph: bool = False  # prefill runs eager (--disable-prefill-cuda-graph)
    # hybrid linear-attention (KDA / GDN / Mamba2) models
    max_mamba_cache_size: int | None = None
    mamba_ssm_dtype: str | None = None  # None: config's mamba_ssm_dtype, else float32
    mamba_full_memory_ratio: float = 0.9
    mamba_radix_cache_strategy: str = "auto"  # auto | no_buffer | extra_buffer
    mamba_track_interval: int = 256
    # hybrid sliding-window models
    swa_full_tokens_ratio: float = 0.8  # SWA pool tokens per full pool token
    # speculative decoding (arg_groups/fields/spec.py:31-69); None: off, or SGLang's auto-default
    speculative_algorithm: str | None = None  # EAGLE | EAGLE3 | NEXTN | STANDALONE (pools/sizing/speculative.py)
    speculative_draft_model_path: str | None = None  # a config.json or catalog name
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    # poolsim's own: what the data accepts (acceptance is a property of the data, not of the server)
    speculative_accept_length: float | None = None  # mean tokens per verify step, bonus included
    speculative_accept_file: str | None = None  # a per-step accept-length distribution (docs/usage.md)
    # HiCache: the host-memory (and storage) tiers of the KV cache (arg_groups/fields/memory.py:98-209)
    enable_hierarchical_cache: bool = False
    hicache_ratio: float | None = None  # None: 2.0 in cache mode, 1.2 in buffer_only (hicache_hook.py:119-122)
    hicache_size: int = 0  # GB (1e9 B) per rank; > 0 overrides the ratio
    hicache_host_memory_fraction: float | None = 0.8  # auto-sizing's share of host RAM (ratio and size unset)
    hicache_host_memory_mode: str = "cache"  # cache | buffer_only
    hicache_write_policy: str = "write_through"  # write_through | write_through_selective | write_back
    hicache_io_backend: str = "kernel"  # direct | kernel | kernel_ascend
    hicache_mem_layout: str = "page_first"  # layer_first | page_first | page_first_direct | ...
    hicache_storage_backend: str | None = None  # file | mooncake | hf3fs | nixl | ... (L3)
    hicache_storage_prefetch_policy: str = "timeout"  # best_effort | wait_complete | timeout
    hicache_storage_backend_extra_config: str | None = None  # JSON; accepted, not read by poolsim
    hicache_storage_prefetch_retry_poll_interval: int = 8
    hicache_storage_prefetch_retry_max_attempts: int = 8
    # poolsim's own, not SGLang's: the machine's RAM that SGLang checks the host pools against (None: the GPU
    # catalog's typical server of that GPU)
    host_memory_gib: float | None = None

    def __post_init__(self) -> None:
        check_numbers(self)

    def replace(self, **changes) -> "ServerArgs":
        known = {f.name for f in fields(self)}
        unknown = set(changes) - known
        if unknown:
            raise ValueError(f"unknown server argument(s): {', '.join(sorted(unknown))}")
        return ServerArgs(**{**asdict(self), **changes})

    def to_dict(self) -> dict:
        return asdict(self)


class ServerFlag(NamedTuple):
    field: str  # the ServerArgs field: its type and default (SGLang's) are the flag's
    names: tuple[str, ...]  # a short name poolsim adds comes first (--tp, then SGLang's --tp-size)
    help: str
    # accepted, not listed by --help: SGLang's names longer than the 28 characters --help's name column has at
    # 80 columns (the listed name is a shorter one: SGLang's own alias where it has one)
    hidden_names: tuple[str, ...] = ()


# Every ServerArgs field as a command-line flag, in the order `poolsim run --help` lists them: the CLI generates
# its options from this table, so a flag's names and help are here and its type and default on the field.
SERVER_FLAGS = (
    ServerFlag("tp_size", ("--tp", "--tp-size"), "The tensor parallelism size."),
    ServerFlag("dp_size", ("--dp", "--dp-size"), "Data-parallel replicas (each with tp GPUs)."),
    ServerFlag("attn_dp_size", ("--attn-dp-size", "--attention-data-parallel-size"),
               "The attention data parallelism size: the number of data-parallel attention groups inside the TP "
               "group, one scheduler each, while the FFN stays tensor parallel."),
    ServerFlag("moe_dense_tp_size", ("--moe-dense-tp-size",),
               "TP size for MoE dense MLP layers: unset (tp) or 1 (replicated)."),
    ServerFlag("nnodes", ("--nnodes",), "The number of nodes."),
    ServerFlag("pp_size", ("--pp", "--pp-size", "--pipeline-parallel-size"), "The pipeline parallelism size."),
    ServerFlag("ep_size", ("--ep", "--ep-size", "--expert-parallel-size"), "The expert parallelism size."),
    ServerFlag("moe_a2a_backend", ("--moe-a2a-backend",),
               "Choose the backend for MoE A2A: none (poolsim does not size the others)."),
    ServerFlag("mem_fraction_static", ("--mem-fraction-static",),
               "The fraction of the memory used for static allocation (model weights and KV cache memory pool); "
               "unset: SGLang's default."),
    ServerFlag("page_size", ("--page-size",), "The number of tokens in a page."),
    ServerFlag("kv_cache_dtype", ("--kv-cache-dtype",),
               "Data type for kv cache storage: auto (the model's), bfloat16, fp8_e4m3 or fp8_e5m2."),
    ServerFlag("context_length", ("--context-length",),
               "The model's maximum context length; unset: the value from config.json."),
    ServerFlag("max_running_requests", ("--max-running-requests",), "The maximum number of running requests."),
    ServerFlag("max_total_tokens", ("--max-total-tokens",),
               "The maximum number of tokens in the memory pool; unset: from the memory fraction. Clamped to what "
               "fits."),
    ServerFlag("max_prefill_tokens", ("--max-prefill-tokens",), "The maximum number of tokens in a prefill batch."),
    ServerFlag("chunked_prefill_size", ("--chunked-prefill-size",),
               "The maximum number of tokens in a chunk for the chunked prefill; -1 disables chunking; unset: "
               "SGLang's default."),
    ServerFlag("schedule_policy", ("--schedule-policy",), "The scheduling policy of the requests: fcfs or lpm."),
    ServerFlag("schedule_conservativeness", ("--schedule-conservativeness",),
               "How conservative the schedule policy is; larger: fewer retractions."),
    ServerFlag("max_mamba_cache_size", ("--max-mamba-cache-size",), "The maximum size of the mamba cache (slots)."),
    ServerFlag("mamba_ssm_dtype", ("--mamba-ssm-dtype",),
               "The data type of the SSM states: float32, bfloat16 or float16; unset: config.json's."),
    ServerFlag("mamba_full_memory_ratio", ("--mamba-full-memory-ratio",),
               "The ratio of mamba state memory to full kv cache memory."),
    ServerFlag("mamba_radix_cache_strategy", ("--mamba-radix-cache-strategy",),
               "The strategy to use for mamba radix cache: auto, no_buffer or extra_buffer."),
    ServerFlag("mamba_track_interval", ("--mamba-track-interval",),
               "The interval to track the mamba state during decode (extra_buffer)."),
    ServerFlag("swa_full_tokens_ratio", ("--swa-full-tokens-ratio",),
               "Hybrid-SWA models: SWA pool tokens per full pool token."),
    ServerFlag("attention_backend", ("--attention-backend",),
               "Choose the kernels for attention layers; unset: SGLang's default for the GPU."),
    ServerFlag("disable_radix_cache", ("--disable-radix-cache",), "Disable RadixAttention for prefix caching."),
    ServerFlag("disable_overlap_schedule", ("--disable-overlap-schedule",),
               "Disable the overlap scheduler (CPU scheduling overlapped with the GPU forward)."),
    ServerFlag("enable_mixed_chunk", ("--enable-mixed-chunk",),
               "Mix prefill and decode in a batch when using chunked prefill."),
    ServerFlag("scheduler_recv_interval", ("--scheduler-recv-interval",),
               "The interval to poll requests in scheduler: while decoding, new requests are read every N steps."),
    ServerFlag("disable_cuda_graph", ("--disable-cuda-graph",),
               "Disable CUDA graphs (frees the memory their capture reserves)."),
    ServerFlag("disable_prefill_cuda_graph", ("--disable-prefill-cuda-graph",),
               "Prefill runs eager (as SGLang 0.5.6-0.5.7 did)."),
    ServerFlag("speculative_algorithm", ("--speculative-algorithm",),
               "Speculative algorithm: EAGLE, EAGLE3, NEXTN (EAGLE on the model's own MTP layers) or STANDALONE."),
    ServerFlag("speculative_draft_model_path", ("--speculative-draft-model",),
               "The draft model: a config.json path or a catalog name; unset for NEXTN on a model that ships its "
               "own NextN layers. Also accepted as SGLang's name with a -path suffix.",
               hidden_names=("--speculative-draft-model-path",)),
    ServerFlag("speculative_num_steps", ("--speculative-num-steps",),
               "The number of steps sampled from draft model in Speculative Decoding; unset: SGLang's auto choice."),
    ServerFlag("speculative_eagle_topk", ("--speculative-eagle-topk",),
               "The number of tokens sampled from the draft model in eagle2 each step."),
    ServerFlag("speculative_num_draft_tokens", ("--speculative-draft-tokens",),
               "The number of tokens sampled from the draft model in Speculative Decoding (verified per step); also "
               "accepted as SGLang's name, with num- before draft.",
               hidden_names=("--speculative-num-draft-tokens",)),
    ServerFlag("speculative_accept_length", ("--speculative-accept-length",),
               "poolsim: mean tokens accepted per verify step, bonus token included (SGLang's logged "
               "'accept len'), in [1, num_steps + 1]; run and bench need it or --speculative-accept-file."),
    ServerFlag("speculative_accept_file", ("--speculative-accept-file",),
               "poolsim: a JSON list of counts or probabilities, entry i for i accepted draft tokens (accept "
               "length i + 1), as SGLang's per-request histogram of correct drafts counts them."),
    ServerFlag("enable_hierarchical_cache", ("--enable-hierarchical-cache",),
               "Enable hierarchical cache (HiCache; also --enable-hicache): evicted KV stays in a host-memory pool "
               "and is loaded back.", hidden_names=("--enable-hicache",)),
    ServerFlag("hicache_ratio", ("--hicache-ratio",),
               "The ratio of the size of host KV cache memory pool to the size of device pool; unset: 2.0 in cache "
               "mode, 1.2 in buffer_only mode (reduced to fit host memory when --hicache-size is unset too)."),
    ServerFlag("hicache_size", ("--hicache-size",),
               "The size of host KV cache memory pool in gigabytes (per rank). Overrides --hicache-ratio."),
    ServerFlag("hicache_host_memory_fraction", ("--hicache-host-fraction",),
               "Fraction of the host memory (after a 10 GiB reserve) the host pools of all ranks may use when "
               "neither --hicache-ratio nor --hicache-size is set: the default ratio is reduced until they fit. "
               "SGLang's name: --hicache-host-memory-fraction.", hidden_names=("--hicache-host-memory-fraction",)),
    ServerFlag("hicache_host_memory_mode", ("--hicache-host-memory-mode",),
               "cache (a persistent host tier) or buffer_only (a staging buffer for the storage backend)."),
    ServerFlag("hicache_write_policy", ("--hicache-write-policy",),
               "The write policy of hierarchical cache: write_through, write_through_selective or write_back."),
    ServerFlag("hicache_io_backend", ("--hicache-io-backend",),
               "The IO backend for KV cache transfer between CPU and GPU: direct, kernel or kernel_ascend."),
    ServerFlag("hicache_mem_layout", ("--hicache-mem-layout",),
               "The layout of host memory pool for hierarchical cache: layer_first, page_first, page_first_direct, "
               "page_first_kv_split or page_head."),
    ServerFlag("hicache_storage_backend", ("--hicache-storage-backend",),
               "The storage backend for hierarchical KV cache (L3): file, mooncake, hf3fs, nixl, ...; accepted, the "
               "storage tier is not simulated."),
    ServerFlag("hicache_storage_prefetch_policy", ("--hicache-prefetch-policy",),
               "Control when prefetching from the storage backend should stop: best_effort, wait_complete or "
               "timeout. SGLang's name: --hicache-storage-prefetch-policy.",
               hidden_names=("--hicache-storage-prefetch-policy",)),
    ServerFlag("hicache_storage_backend_extra_config", ("--hicache-storage-config",),
               "Extra configuration for the storage backend (JSON); accepted, not read by poolsim. SGLang's name: "
               "--hicache-storage-backend-extra-config.", hidden_names=("--hicache-storage-backend-extra-config",)),
    ServerFlag("hicache_storage_prefetch_retry_poll_interval", ("--hicache-prefetch-poll",),
               "Scheduling passes before a storage availability check is re-issued (accepted, not modelled). "
               "SGLang's name: --hicache-storage-prefetch-retry-poll-interval.",
               hidden_names=("--hicache-storage-prefetch-retry-poll-interval",)),
    ServerFlag("hicache_storage_prefetch_retry_max_attempts", ("--hicache-prefetch-retries",),
               "Storage availability re-issues a queued request may make (accepted, not modelled). SGLang's name: "
               "--hicache-storage-prefetch-retry-max-attempts.",
               hidden_names=("--hicache-storage-prefetch-retry-max-attempts",)),
    ServerFlag("host_memory_gib", ("--host-memory-gib",),
               "poolsim: the machine's RAM (GiB) available to SGLang, which checks the HiCache host pools against "
               "it; unset: the GPU catalog's typical server of that GPU (poolsim gpus)."),
)


# Numbers SGLang would reject or that make no server (a track interval of 0 divides by zero; a negative
# conservativeness admits without bound): checked where a ServerArgs is made, so a sweep grid's bad value is that
# row's error. tp is checked with the model (pools/sizing/plan.py validate_tp), whose heads it must divide.
_AT_LEAST_1 = ("dp_size", "attn_dp_size", "moe_dense_tp_size", "ep_size", "pp_size", "nnodes", "page_size",
               "max_prefill_tokens", "scheduler_recv_interval", "mamba_track_interval", "context_length",
               "max_running_requests", "max_total_tokens", "max_mamba_cache_size")
_POSITIVE = ("schedule_conservativeness", "mamba_full_memory_ratio", "swa_full_tokens_ratio")


def _text(v) -> str:
    """A number as the user typed it: 1.5, -1, inf (not -1.0)."""
    return f"{v:g}" if isinstance(v, float) else repr(v) if isinstance(v, str) else str(v)


def _flag(name: str) -> str:
    return next((f.names[0] for f in SERVER_FLAGS if f.field == name), "--" + name.replace("_", "-"))


def check_numbers(args: ServerArgs) -> None:
    import math

    for name in _AT_LEAST_1:
        v = getattr(args, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{_flag(name)} {v}: must be a whole number >= 1")
    for name in _POSITIVE:
        v = getattr(args, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{_flag(name)} {_text(v)}: must be a finite number > 0")
    c = args.chunked_prefill_size
    if c is not None and (isinstance(c, bool) or not isinstance(c, int) or (c < 1 and c != -1)):
        raise ValueError(f"{_flag('chunked_prefill_size')} {c}: must be >= 1, or -1 to disable chunking")
    m = args.mem_fraction_static
    if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 < m < 1):
        raise ValueError(f"{_flag('mem_fraction_static')} {_text(m)}: must be a fraction between 0 and 1")
