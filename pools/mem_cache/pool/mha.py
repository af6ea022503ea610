"""MHA/GQA KV storage (``memory_pool.py`` ``MHATokenToKVPool``): K and V per layer, heads per tp rank."""

from __future__ import annotations

from poolsim.pools.dtypes import torch_store_dtype
from poolsim.pools.mem_cache.pool.base import KVCache


class MHATokenToKVPool(KVCache):
    """Per layer ``k_buffer[rows, head_num, head_dim]`` and ``v_buffer[rows, head_num, v_head_dim]``."""

    def __init__(self, size: int, page_size: int, dtype: str, head_num: int, head_dim: int, layer_num: int,
                 device: str | None = None, v_head_dim: int | None = None):
        super().__init__(size, page_size, dtype, layer_num, device)
        self.head_num = head_num  # per tp rank
        self.head_dim = head_dim
        self.v_head_dim = head_dim if v_head_dim is None else v_head_dim
        if device is not None:
            import torch

            store = torch_store_dtype(dtype)
            self.k_buffer = [torch.zeros((self.rows, head_num, head_dim), dtype=store, device=device)
                             for _ in range(layer_num)]
            self.v_buffer = [torch.zeros((self.rows, head_num, self.v_head_dim), dtype=store, device=device)
                             for _ in range(layer_num)]

    def get_kv_size_bytes(self) -> tuple[int, int]:
        k = self.layer_num * self.rows * self.head_num * self.head_dim * self.store_bytes
        v = self.layer_num * self.rows * self.head_num * self.v_head_dim * self.store_bytes
        return k, v

    def cell_size_bytes(self) -> int:
        """KV bytes per token over all layers on one rank."""
        return self.head_num * (self.head_dim + self.v_head_dim) * self.layer_num * self.store_bytes
