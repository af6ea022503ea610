"""The subset of SGLang's ``ServerArgs`` that decides memory and scheduling, with SGLang's names and defaults.

``None`` means "let SGLang pick", exactly as an unset server flag does; ``pools.sizing.plan`` resolves
those defaults (``mem_fraction_static``, ``chunked_prefill_size``, ``max_running_requests``, ...).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class ServerArgs:
    tp_size: int = 1
    dp_size: int = 1
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

    def replace(self, **changes) -> "ServerArgs":
        known = {f.name for f in fields(self)}
        unknown = set(changes) - known
        if unknown:
            raise ValueError(f"unknown server argument(s): {', '.join(sorted(unknown))}")
        return ServerArgs(**{**asdict(self), **changes})

    def to_dict(self) -> dict:
        return asdict(self)
