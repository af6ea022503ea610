"""Build one simulated SGLang server (one dp rank): pools, tree cache and scheduler from resolved numbers."""

from __future__ import annotations

from dataclasses import dataclass

from poolsim.pools import (
    DisabledRadixCache,
    HybridReqToTokenPool,
    MambaRadixCache,
    PagedTokenToKVPoolAllocator,
    RadixCache,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from poolsim.pools.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from poolsim.pools.mem_cache.hiradix_cache import HiRadixCache
from poolsim.pools.mem_cache.pool.mamba import MambaCacheParams
from poolsim.pools.mem_cache.pool_host.base import HostKVCache
from poolsim.pools.mem_cache.swa_radix_cache import SWARadixCache
from poolsim.sim.scheduler import Scheduler, SchedulerConfig


@dataclass(frozen=True)
class MambaConfig:
    """The state pool of a hybrid linear-attention model."""

    max_mamba_cache_size: int
    cache_params: MambaCacheParams
    strategy: str = "no_buffer"  # no_buffer | extra_buffer
    ping_pong_track_buffer_size: int = 0  # extra_buffer: 2 with the overlap schedule, 1 without
    mamba_track_interval: int = 256


@dataclass(frozen=True)
class SWAConfig:
    """The second KV pool of a hybrid-SWA model (``config.max_total_num_tokens`` is the full pool)."""

    swa_max_total_num_tokens: int
    sliding_window_size: int


@dataclass(frozen=True)
class HiCacheConfig:
    """The host tier of one server (``--enable-hierarchical-cache``): the host pool a plan sized, the write policy,
    and the effective host-link bandwidth its copies take."""

    host_tokens: int  # the host pool's size, padding page included (plan.hicache.host_tokens)
    size_per_token: int  # B
    write_policy: str = "write_through"
    bandwidth: float = float("inf")  # effective B/s per direction (GPU catalog host link x efficiency)


def build_server(config: SchedulerConfig, mamba: MambaConfig | None = None, disable_radix_cache: bool = False,
                 recorder=None, replica: int = 0, device: str | None = None, checks: bool = True,
                 swa: SWAConfig | None = None, hicache: HiCacheConfig | None = None) -> Scheduler:
    """``device``: None runs the pools on numpy (the simulator); a torch device runs the same bookkeeping on
    torch tensors there, state buffers included (the validation path). ``checks``: the free lists' double-free
    checks (off for a plain run: they never change an id). ``swa``: a hybrid-SWA model's two pools,
    ``SWATokenToKVPoolAllocator`` and the SWA radix cache (not with mamba or a disabled cache). ``hicache``: the
    radix cache with a host tier (``HiRadixCache``; MHA/MLA models only)."""
    rows = config.max_running_requests
    width = config.max_context_len or config.context_len
    if mamba is None:
        pool = ReqToTokenPool(rows, width, device=device)
    else:
        buffers = mamba.ping_pong_track_buffer_size if mamba.strategy == "extra_buffer" else 0
        pool = HybridReqToTokenPool(rows, width, mamba.max_mamba_cache_size, mamba.cache_params, device=device,
                                    mamba_ping_pong_track_buffer_size=buffers)
    if hicache is not None and (mamba is not None or swa is not None or disable_radix_cache):
        raise ValueError("the HiCache host tier is simulated for MHA/MLA models with the radix cache on")
    if swa is not None:
        if mamba is not None or disable_radix_cache:
            raise ValueError("hybrid-SWA pools are simulated with the radix cache on and no mamba state")
        allocator = SWATokenToKVPoolAllocator(config.max_total_num_tokens, swa.swa_max_total_num_tokens,
                                              config.page_size, device=device)
        allocator.set_checks(checks)
        return Scheduler(config, SWARadixCache(pool, allocator, swa.sliding_window_size), pool,
                         recorder=recorder, replica=replica)
    if config.page_size == 1:
        allocator = TokenToKVPoolAllocator(config.max_total_num_tokens, device=device)
    else:
        allocator = PagedTokenToKVPoolAllocator(config.max_total_num_tokens, config.page_size, device=device)
    allocator.set_checks(checks)
    if mamba is not None:
        pool.mamba_allocator.set_checks(checks)
    if disable_radix_cache:
        tree = DisabledRadixCache(pool, allocator)
    elif mamba is not None:
        tree = MambaRadixCache(pool, allocator, strategy=mamba.strategy,
                               mamba_track_interval=mamba.mamba_track_interval)
    elif hicache is not None:
        host = HostKVCache(hicache.size_per_token, config.max_total_num_tokens, 0.0, 0, config.page_size,
                           host_token_capacity=hicache.host_tokens)
        tree = HiRadixCache(pool, allocator, host, hicache.write_policy, bandwidth=hicache.bandwidth)
    else:
        tree = RadixCache(pool, allocator)
    return Scheduler(config, tree, pool, recorder=recorder, replica=replica)
