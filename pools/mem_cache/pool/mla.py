"""MLA KV storage (``memory_pool.py`` ``MLATokenToKVPool``): the full latent plus the rope part on every rank."""

from __future__ import annotations

from poolsim.pools.dtypes import torch_store_dtype
from poolsim.pools.mem_cache.pool.base import KVCache


class MLATokenToKVPool(KVCache):
    """Per layer ``kv_buffer[rows, 1, kv_lora_rank + qk_rope_head_dim]``; not divided by tp."""

    def __init__(self, size: int, page_size: int, dtype: str, kv_lora_rank: int, qk_rope_head_dim: int,
                 layer_num: int, device: str | None = None):
        super().__init__(size, page_size, dtype, layer_num, device)
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim
        if device is not None:
            import torch

            store = torch_store_dtype(dtype)
            self.kv_buffer = [torch.zeros((self.rows, 1, self.kv_cache_dim), dtype=store, device=device)
                              for _ in range(layer_num)]

    def get_kv_size_bytes(self) -> int:
        return self.layer_num * self.rows * self.kv_cache_dim * self.store_bytes

    def cell_size_bytes(self) -> int:
        return self.kv_cache_dim * self.layer_num * self.store_bytes
