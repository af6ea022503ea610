"""What every KV storage pool shares (``memory_pool.py`` ``KVCache``): its byte sizes; on a torch device, its buffers.

Rows per layer are ``size + page_size``: the first page is the padding page that slot 0 lives in.
MHA/GQA heads are per tp rank; MLA stores the full latent on every rank; the hybrid pool holds
the full-attention layers only (the recurrent state lives in the ``MambaPool``).
"""

from __future__ import annotations

from poolsim.pools.dtypes import dtype_bytes
from poolsim.pools.errors import PoolError


class KVCache:
    def __init__(self, size: int, page_size: int, dtype: str, layer_num: int, device: str | None):
        if size < 0 or layer_num < 0:
            raise PoolError(f"KV pool size ({size}) and layer_num ({layer_num}) must be >= 0")
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.store_bytes = dtype_bytes(dtype)
        self.layer_num = layer_num
        self.device = device

    @property
    def rows(self) -> int:
        return self.size + self.page_size
