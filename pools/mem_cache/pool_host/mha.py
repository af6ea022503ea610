"""HiCache's MHA/GQA host pool (SGLang 0.5.23 ``pool_host/mha.py`` ``MHATokenToKVPoolHost``): K and V of every
layer of a token, the device pool's heads per rank and store dtype (``get_size_per_token``,
``pool_host/mha.py:290-296``):

    size_per_token = (head_dim + v_head_dim) x head_num x layer_num x dtype bytes
"""

from __future__ import annotations

from poolsim.pools.mem_cache.pool.mha import MHATokenToKVPool
from poolsim.pools.mem_cache.pool_host.base import HostKVCache


class MHATokenToKVPoolHost(HostKVCache):
    def __init__(self, device_pool: MHATokenToKVPool, host_to_device_ratio: float, host_size: float,
                 page_size: int, budget_bytes: int | None = None):
        self.head_num, self.head_dim = device_pool.head_num, device_pool.head_dim
        self.v_head_dim = device_pool.v_head_dim
        self.layer_num, self.dtype_bytes = device_pool.layer_num, device_pool.store_bytes
        super().__init__(self.get_size_per_token(), device_pool.size, host_to_device_ratio, host_size, page_size,
                         budget_bytes)

    def get_size_per_token(self) -> int:
        return (self.head_dim + self.v_head_dim) * self.head_num * self.layer_num * self.dtype_bytes
