"""HiCache's MLA host pool (SGLang 0.5.23 ``pool_host/mla.py`` ``MLATokenToKVPoolHost``): the latent row of every
layer, as wide as the device pool's (``_size_per_token``, ``pool_host/mla.py:195-197``; the row width is the device
pool's ``kv_cache_dim``, ``hybrid_cache/hybrid_pool_assembler.py:184-187``):

    size_per_token = (kv_lora_rank + qk_rope_head_dim) x layer_num x dtype bytes
"""

from __future__ import annotations

from poolsim.pools.mem_cache.pool.mla import MLATokenToKVPool
from poolsim.pools.mem_cache.pool_host.base import HostKVCache


class MLATokenToKVPoolHost(HostKVCache):
    def __init__(self, device_pool: MLATokenToKVPool, host_to_device_ratio: float, host_size: float,
                 page_size: int, budget_bytes: int | None = None):
        self.kv_cache_dim, self.layer_num = device_pool.kv_cache_dim, device_pool.layer_num
        self.dtype_bytes = device_pool.store_bytes
        super().__init__(self.get_size_per_token(), device_pool.size, host_to_device_ratio, host_size, page_size,
                         budget_bytes)

    def get_size_per_token(self) -> int:
        return self.kv_cache_dim * self.dtype_bytes * self.layer_num
