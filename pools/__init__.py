"""SGLang 0.5.23's memory machinery, one class per SGLang concept, over numpy (simulation) or torch (device)."""

from pools._pure_python import install_if_asked

install_if_asked()  # POOLSIM_PURE_PYTHON=1: the .py sources, not the compiled modules

from pools.allocator import MambaSlotAllocator, PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from pools.errors import DoubleFreeError, MambaCapacityError, OutOfMemoryError, PoolError
from pools.kv_cache import HybridLinearKVPool, MHATokenToKVPool, MLATokenToKVPool
from pools.mamba_pool import MambaCacheParams, MambaPool, MambaStateShape
from pools.mamba_radix_cache import MambaRadixCache
from pools.no_cache import DisabledRadixCache
from pools.radix_cache import RadixCache, RadixKey
from pools.req_kv import ReqKvInfo
from pools.req_to_token_pool import HybridReqToTokenPool, ReqToTokenPool
from pools.server_args import ServerArgs

__all__ = [
    "ReqToTokenPool", "HybridReqToTokenPool",
    "TokenToKVPoolAllocator", "PagedTokenToKVPoolAllocator", "MambaSlotAllocator",
    "MHATokenToKVPool", "MLATokenToKVPool", "HybridLinearKVPool",
    "MambaPool", "MambaStateShape", "MambaCacheParams",
    "RadixCache", "RadixKey", "MambaRadixCache", "DisabledRadixCache", "ReqKvInfo",
    "ServerArgs",
    "PoolError", "DoubleFreeError", "OutOfMemoryError", "MambaCapacityError",
]
