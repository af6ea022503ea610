"""HiCache's host pools as SGLang 0.5.23 sizes them, after the device pools (``--enable-hierarchical-cache``).

The flags are resolved first as ``arg_groups/hicache_hook.py`` resolves them:

- ``--enable-hierarchical-cache`` with ``--disable-radix-cache`` is refused (``arg_groups/kv_cache_hook.py:393-397``);
- ``--hicache-host-memory-mode buffer_only`` needs ``--hicache-storage-backend`` and turns ``write_back`` into
  ``write_through`` (``validate_hicache_host_memory_mode``, ``hicache_hook.py:247-293``);
- ``--hicache-ratio`` unset: 2.0 in cache mode, 1.2 in buffer_only mode (``handle_hicache_ratio_default``,
  ``hicache_hook.py:100-126``); an explicit ratio or a ``--hicache-size`` turns host-memory auto-sizing off;
- layout and io backend (``resolve_layout_io_compatibility``, ``:171-193``): ``page_first_direct`` with the
  ``kernel`` backend switches to ``direct``; ``page_first`` with ``direct`` switches to ``page_first_direct``;
  a mooncake / npu_memcache storage backend moves ``layer_first`` to ``page_first`` (``kernel``) or
  ``page_first_direct`` (``direct``) (``resolve_storage_layout_compatibility``, ``:196-226``).

Auto-sizing (``mem_cache/hicache_auto_size.py:82-125``), when neither ``--hicache-ratio`` nor ``--hicache-size`` is
given and ``--hicache-host-memory-fraction`` is set (0.8 by default): the ratio becomes
``min(ratio, budget x (1 - 0.05) / device_bytes)`` with ``budget = int(host budget x fraction)`` and
``device_bytes`` the device KV pool's bytes (plus the mamba pool's for hybrids); the host pools are then booked one
after the other against that one budget (``host_memory_budget_scope``). Without auto-sizing each pool is checked on
its own against the whole per-rank budget (``host_memory_budget_bytes`` books nothing outside a scope).

The pools (``hybrid_cache/hybrid_pool_assembler.py``): one KV host pool over the device KV pool (for a hybrid model,
its full-attention pool: ``build_hybrid_mamba_stack``, ``:1296-1336``), and for a hybrid linear-attention model a
mamba host pool over the mamba state pool (``build_mamba_host_pool``, ``:1252-1274``). A ``--hicache-size`` is split
between the two in proportion to their device bytes (``_split_hicache_size``, ``:234-249``).

The host budget is per rank: ``(host RAM available - 10 GiB) // ranks on the host`` (``pool_host/base.py:84-108``;
``ranks_per_host`` is the launch's world size over ``--nnodes``, ``:68-81``). poolsim takes the RAM from
``--host-memory-gib``, else the GPU catalog's typical server of that GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from poolsim.pools.errors import SizingError
from poolsim.pools.hardware.gpu_catalog import GIB, GPUSpec
from poolsim.pools.mem_cache.pool.base import KVCache
from poolsim.pools.mem_cache.pool.hybrid import HybridLinearKVPool
from poolsim.pools.mem_cache.pool.mamba import MambaPool
from poolsim.pools.mem_cache.pool.mla import MLATokenToKVPool
from poolsim.pools.mem_cache.pool_host.base import HostKVCache, host_memory_budget_bytes
from poolsim.pools.mem_cache.pool_host.mamba import MambaPoolHost
from poolsim.pools.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from poolsim.pools.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from poolsim.pools.sizing.server_args import ServerArgs

# arg_groups/fields/memory.py:98-209: each flag's choices
HOST_MEMORY_MODES = ("cache", "buffer_only")
WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")
IO_BACKENDS = ("direct", "kernel", "kernel_ascend")
MEM_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_first_kv_split", "page_head")
STORAGE_BACKENDS = ("file", "sim", "mooncake", "npu_memcache", "hf3fs", "nixl", "aibrix", "dynamic", "eic", "simm",
                    "mori", "shm", "tensorcast", "seaweedfs")
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
AUTO_SIZE_SLACK_FRACTION = 0.05  # hicache_auto_size.py:33: page rounding, allocator metadata, staging buffers


@dataclass(frozen=True)
class HiCachePlan:
    """The host tier of one tp rank. ``host_tokens`` is the KV host pool's ``size`` (padding page included)."""

    host_tokens: int
    host_bytes: int
    size_per_token: int  # B per token on this rank
    device_tokens: int  # the device pool the ratio multiplies (max_total_num_tokens)
    hicache_ratio: float  # as resolved (auto-sized or SGLang's default when not given)
    hicache_size_gb: float  # --hicache-size (0: from the ratio); for a hybrid, the KV pool's share of it
    ratio_source: str  # "--hicache-ratio", "--hicache-size", "default" or "auto-sized"
    host_memory_mode: str
    write_policy: str
    io_backend: str
    mem_layout: str
    storage_backend: str | None
    storage_prefetch_policy: str
    host_memory_gib: float | None  # the machine's RAM poolsim assumed (None: unknown, not checked)
    host_memory_source: str  # "--host-memory-gib", "catalog: ..." or "unknown"
    ranks_per_host: int
    budget_bytes: int | None  # what one rank may take: (RAM - 10 GiB) // ranks (None: RAM unknown)
    auto_size_budget_bytes: int | None  # auto-sizing: int(budget_bytes x fraction), both pools booked against it
    page_size: int
    # hybrid linear-attention models: the mamba host pool (None otherwise)
    mamba_host_states: int | None = None
    mamba_host_bytes: int | None = None
    mamba_size_per_state: int | None = None

    @property
    def total_host_bytes(self) -> int:
        return self.host_bytes + (self.mamba_host_bytes or 0)

    def table_rows(self) -> list[tuple[str, str]]:
        ratio = f"ratio {self.hicache_ratio:g} ({self.ratio_source})" if not self.hicache_size_gb else \
            f"--hicache-size {self.hicache_size_gb:g} GB"
        rows = [("HiCache host pool", f"{self.host_tokens:,} tokens x {self.size_per_token:,} B = "
                                      f"{self.host_bytes / 1e9:.2f} GB per rank ({ratio}; device pool "
                                      f"{self.device_tokens:,} tokens)")]
        if self.mamba_host_states is not None:
            rows.append(("HiCache mamba host pool", f"{self.mamba_host_states:,} states x "
                                                    f"{self.mamba_size_per_state:,} B = "
                                                    f"{self.mamba_host_bytes / 1e9:.2f} GB per rank"))
        ram = (f"{self.host_memory_gib:g} GiB ({self.host_memory_source}), {self.ranks_per_host} ranks: "
               f"{self.budget_bytes / 1e9:.2f} GB per rank after the 10 GiB reserve"
               if self.host_memory_gib is not None else "unknown (--host-memory-gib): not checked")
        if self.auto_size_budget_bytes is not None:
            ram += f"; auto-sizing: {self.auto_size_budget_bytes / 1e9:.2f} GB (x --hicache-host-memory-fraction)"
        rows += [("HiCache policy", f"{self.host_memory_mode}, {self.write_policy}, io {self.io_backend}, layout "
                                    f"{self.mem_layout}" + (f", storage {self.storage_backend} (prefetch "
                                                            f"{self.storage_prefetch_policy})"
                                                            if self.storage_backend else "")),
                 ("host memory", ram)]
        return rows


def resolve_hicache_args(args: ServerArgs) -> dict:
    """The flags as SGLang resolves them (module docstring): ratio (None: auto/ default pending), policy, layout,
    io backend, mode."""
    checks = (("--hicache-host-memory-mode", args.hicache_host_memory_mode, HOST_MEMORY_MODES),
              ("--hicache-write-policy", args.hicache_write_policy, WRITE_POLICIES),
              ("--hicache-io-backend", args.hicache_io_backend, IO_BACKENDS),
              ("--hicache-mem-layout", args.hicache_mem_layout, MEM_LAYOUTS),
              ("--hicache-storage-prefetch-policy", args.hicache_storage_prefetch_policy, PREFETCH_POLICIES))
    for flag, value, choices in checks:
        if value not in choices:
            raise SizingError(f"{flag} {value!r} is not one of {', '.join(choices)}")
    if args.hicache_storage_backend is not None and args.hicache_storage_backend not in STORAGE_BACKENDS:
        raise SizingError(f"--hicache-storage-backend {args.hicache_storage_backend!r} is not one of "
                          f"{', '.join(STORAGE_BACKENDS)}")
    if args.disable_radix_cache:  # arg_groups/kv_cache_hook.py:393-397
        raise SizingError("The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive "
                          "and cannot be used at the same time. Please use only one of them.")
    fraction = args.hicache_host_memory_fraction
    if fraction is not None and not 0 < fraction <= 1:  # hicache_hook.py:116-117
        raise SizingError("--hicache-host-memory-fraction must be in (0, 1].")
    if args.hicache_ratio is not None and args.hicache_ratio <= 0 and args.hicache_size <= 0:
        raise SizingError(f"--hicache-ratio {args.hicache_ratio} must be > 0")
    if args.hicache_size < 0:
        raise SizingError(f"--hicache-size {args.hicache_size} must be >= 0")
    mode, policy = args.hicache_host_memory_mode, args.hicache_write_policy
    if mode == "buffer_only":
        if args.hicache_storage_backend is None:  # hicache_hook.py:272-277
            raise SizingError("--hicache-host-memory-mode buffer_only requires a storage backend "
                              "(--hicache-storage-backend): host memory is only a staging buffer and all cached "
                              "data lives in storage.")
        if policy == "write_back":  # hicache_hook.py:278-288
            policy = "write_through"
    explicit = args.hicache_ratio is not None or args.hicache_size > 0
    ratio = args.hicache_ratio if args.hicache_ratio is not None else (1.2 if mode == "buffer_only" else 2.0)
    layout, io = args.hicache_mem_layout, args.hicache_io_backend
    if layout == "page_first_direct" and io == "kernel":  # hicache_hook.py:173-183
        io = "direct"
    if layout == "page_first" and io == "direct":  # :186-193
        layout = "page_first_direct"
    if args.hicache_storage_backend in ("mooncake", "npu_memcache") and layout == "layer_first":  # :203-226
        layout = {"direct": "page_first_direct", "kernel": "page_first"}.get(io, layout)
    return dict(ratio=float(ratio), explicit=explicit, auto=(not explicit and fraction is not None),
                fraction=fraction, mode=mode, policy=policy, layout=layout, io=io)


def _device_bytes(pool: KVCache) -> int:
    sizes = pool.get_kv_size_bytes()
    return sum(sizes) if isinstance(sizes, tuple) else sizes


def _kv_host_pool(kv_pool: KVCache, ratio: float, host_size: float, page_size: int,
                  budget: int | None) -> HostKVCache:
    if isinstance(kv_pool, MLATokenToKVPool):
        return MLATokenToKVPoolHost(kv_pool, ratio, host_size, page_size, budget)
    return MHATokenToKVPoolHost(kv_pool, ratio, host_size, page_size, budget)


def plan_hicache(args: ServerArgs, gpu: GPUSpec, kv_pool: KVCache, mamba_pool: MambaPool | None,
                 model_name: str, is_swa: bool = False, is_dsa: bool = False,
                 ranks_per_host: int | None = None) -> tuple[HiCachePlan, list[str]]:
    """The host pools of one rank over its device pools; (plan, SGLang's warnings). Raises ``SizingError`` where
    SGLang refuses (host memory short, bad flags)."""
    if is_swa or is_dsa:
        raise SizingError(f"--enable-hierarchical-cache: {model_name}'s {'SWA' if is_swa else 'DSA index-K'} host "
                          "pools are not modelled by poolsim (MHA, MLA and hybrid linear-attention models are)")
    r = resolve_hicache_args(args)
    if args.host_memory_gib is not None:
        ram_gib, ram_source = float(args.host_memory_gib), "--host-memory-gib"
        if ram_gib <= 0:
            raise SizingError(f"--host-memory-gib {args.host_memory_gib} must be > 0")
    elif gpu.host_memory_gib is not None:
        ram_gib, ram_source = gpu.host_memory_gib, f"catalog: {gpu.host_system}"
    else:
        ram_gib, ram_source = None, "unknown"
    ranks = ranks_per_host if ranks_per_host is not None else args.tp_size * args.dp_size
    budget = host_memory_budget_bytes(int(ram_gib * GIB), ranks) if ram_gib is not None else None
    full_pool = kv_pool.full_kv_pool if isinstance(kv_pool, HybridLinearKVPool) else kv_pool
    page = kv_pool.page_size
    ratio, source = r["ratio"], "--hicache-ratio" if args.hicache_ratio is not None else "default"
    kv_size = mamba_size = 0.0
    if args.hicache_size > 0:
        source = "--hicache-size"
        kv_size = float(args.hicache_size)
        if mamba_pool is not None:  # _split_hicache_size, hybrid_pool_assembler.py:234-249
            kv_b, mamba_b = _device_bytes(full_pool), mamba_pool.mem_usage_bytes()
            kv_size = args.hicache_size * kv_b / (kv_b + mamba_b)
            mamba_size = args.hicache_size * mamba_b / (kv_b + mamba_b)
    scope = None  # auto-sizing books both pools against one budget (host_memory_budget_scope)
    if r["auto"] and budget is not None:
        device_bytes = _device_bytes(full_pool) + (mamba_pool.mem_usage_bytes() if mamba_pool is not None else 0)
        scope = int(budget * r["fraction"])
        auto_ratio = min(ratio, scope * (1 - AUTO_SIZE_SLACK_FRACTION) / device_bytes)
        if auto_ratio <= 0:  # hicache_auto_size.py:108-112
            raise SizingError("No host memory is left for HiCache after the 10 GiB reserve; set --hicache-ratio or "
                              "--hicache-size explicitly (or a larger --host-memory-gib).")
        if auto_ratio < ratio:
            source = "auto-sized"
        ratio = auto_ratio
    warnings: list[str] = []
    kv_host = _kv_host_pool(full_pool, ratio, kv_size, page, scope if scope is not None else budget)
    warnings += kv_host.warnings
    mamba_fields = {}
    if mamba_pool is not None:
        left = scope - kv_host.size_bytes() if scope is not None else budget
        mamba_host = MambaPoolHost(mamba_pool, ratio, mamba_size, r["layout"], left)
        warnings += mamba_host.warnings
        mamba_fields = dict(mamba_host_states=mamba_host.size, mamba_host_bytes=mamba_host.size_bytes(),
                            mamba_size_per_state=mamba_host.size_per_token)
    plan = HiCachePlan(
        host_tokens=kv_host.size, host_bytes=kv_host.size_bytes(), size_per_token=kv_host.size_per_token,
        device_tokens=full_pool.size, hicache_ratio=ratio, hicache_size_gb=kv_size, ratio_source=source,
        host_memory_mode=r["mode"], write_policy=r["policy"], io_backend=r["io"], mem_layout=r["layout"],
        storage_backend=args.hicache_storage_backend, storage_prefetch_policy=args.hicache_storage_prefetch_policy,
        host_memory_gib=ram_gib, host_memory_source=ram_source, ranks_per_host=ranks,
        budget_bytes=budget, auto_size_budget_bytes=scope, page_size=page, **mamba_fields)
    return plan, warnings
