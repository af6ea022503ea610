"""SGLang 0.5.23's memory machinery, one class per SGLang concept, over numpy (simulation) or torch (device)."""

from poolsim.pools.errors import DoubleFreeError, MambaCapacityError, OutOfMemoryError, PoolError
from poolsim.pools.mem_cache.allocator.mamba import MambaSlotAllocator
from poolsim.pools.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from poolsim.pools.mem_cache.allocator.token import TokenToKVPoolAllocator
from poolsim.pools.mem_cache.mamba_radix_cache import MambaRadixCache
from poolsim.pools.mem_cache.no_cache import DisabledRadixCache
from poolsim.pools.mem_cache.pool.hybrid import HybridLinearKVPool
from poolsim.pools.mem_cache.pool.mamba import MambaCacheParams, MambaPool, MambaStateShape
from poolsim.pools.mem_cache.pool.mha import MHATokenToKVPool
from poolsim.pools.mem_cache.pool.mla import MLATokenToKVPool
from poolsim.pools.mem_cache.pool.req_to_token import HybridReqToTokenPool, ReqToTokenPool
from poolsim.pools.mem_cache.radix_cache import RadixCache, RadixKey
from poolsim.pools.mem_cache.req_kv import ReqKvInfo
from poolsim.pools.sizing.server_args import ServerArgs

__all__ = [
    "ReqToTokenPool", "HybridReqToTokenPool",
    "TokenToKVPoolAllocator", "PagedTokenToKVPoolAllocator", "MambaSlotAllocator",
    "MHATokenToKVPool", "MLATokenToKVPool", "HybridLinearKVPool",
    "MambaPool", "MambaStateShape", "MambaCacheParams",
    "RadixCache", "RadixKey", "MambaRadixCache", "DisabledRadixCache", "ReqKvInfo",
    "ServerArgs",
    "PoolError", "DoubleFreeError", "OutOfMemoryError", "MambaCapacityError",
]
