"""HiCache's mamba host pool of hybrid linear-attention models (SGLang 0.5.23 ``pool_host/mamba.py``
``MambaPoolHost``): one host slot holds one request state (conv + temporal over every linear layer), page size 1
(``get_size_per_token``, ``pool_host/mamba.py:409-421``; sizing ``:172-197``, the same rule as ``HostKVCache``):

    size = int(max_mamba_cache_size x hicache_ratio)  (or the pool's share of --hicache-size) + 1
    size_per_token = (sum of conv elements x conv bytes + temporal elements x ssm bytes) x mamba layers

Its device capacity is the mamba pool's ``size`` (``hybrid_pool_assembler.py:1264-1266``). Only the
``page_first`` and ``page_first_direct`` layouts are supported (``pool_host/mamba.py:103-106``).
"""

from __future__ import annotations

from poolsim.pools.errors import SizingError
from poolsim.pools.mem_cache.pool.mamba import MambaPool
from poolsim.pools.mem_cache.pool_host.base import HostKVCache

MAMBA_HOST_LAYOUTS = ("page_first", "page_first_direct")


class MambaPoolHost(HostKVCache):
    pool_label = "mamba"

    def __init__(self, device_pool: MambaPool, host_to_device_ratio: float, host_size: float,
                 layout: str = "page_first", budget_bytes: int | None = None):
        if layout not in MAMBA_HOST_LAYOUTS:
            raise SizingError(f"--hicache-mem-layout {layout}: SGLang's mamba host pool supports only "
                              f"{' and '.join(MAMBA_HOST_LAYOUTS)} (pool_host/mamba.py:103-106)")
        self.state_bytes = device_pool.cache_params.mamba_cache_per_req
        super().__init__(self.get_size_per_token(), device_pool.size, host_to_device_ratio, host_size, 1,
                         budget_bytes)

    def get_size_per_token(self) -> int:
        return self.state_bytes
