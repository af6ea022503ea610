"""KV storage pools (``memory_pool.py``): they know their byte sizes; on a torch device they own the buffers.

Rows per layer are ``size + page_size``: the first page is the padding page that slot 0 lives in.
MHA/GQA heads are per tp rank; MLA stores the full latent on every rank; the hybrid pool holds
the full-attention layers only (the recurrent state lives in the ``MambaPool``).
"""

from __future__ import annotations

from pools.dtypes import dtype_bytes, torch_store_dtype
from pools.errors import PoolError


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


class HybridLinearKVPool(KVCache):
    """KV for the full-attention layers of a hybrid linear-attention model.

    Wraps an MHA or MLA pool whose ``layer_num`` is the number of full-attention layers;
    ``layer_id`` (the model's global layer index) maps to the dense index of that pool.
    """

    def __init__(self, size: int, page_size: int, dtype: str, full_attention_layer_ids: list[int],
                 mamba_pool, device: str | None = None, use_mla: bool = False, head_num: int = 0,
                 head_dim: int = 0, v_head_dim: int | None = None, kv_lora_rank: int = 0,
                 qk_rope_head_dim: int = 0):
        super().__init__(size, page_size, dtype, len(full_attention_layer_ids), device)
        self.full_attention_layer_ids = list(full_attention_layer_ids)
        self.full_layer_nums = len(self.full_attention_layer_ids)
        self.layer_id_mapping = {lid: i for i, lid in enumerate(self.full_attention_layer_ids)}
        self.mamba_pool = mamba_pool
        self.use_mla = use_mla
        if use_mla:
            self.full_kv_pool = MLATokenToKVPool(size, page_size, dtype, kv_lora_rank, qk_rope_head_dim,
                                                 self.full_layer_nums, device)
        else:
            self.full_kv_pool = MHATokenToKVPool(size, page_size, dtype, head_num, head_dim,
                                                 self.full_layer_nums, device, v_head_dim)

    def dense_layer(self, layer_id: int) -> int:
        try:
            return self.layer_id_mapping[layer_id]
        except KeyError:
            raise PoolError(f"layer {layer_id} is not a full-attention layer of this hybrid pool") from None

    def get_kv_size_bytes(self):
        return self.full_kv_pool.get_kv_size_bytes()

    def cell_size_bytes(self) -> int:
        return self.full_kv_pool.cell_size_bytes()
