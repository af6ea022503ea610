"""The KV pool of hybrid linear-attention models (``memory_pool.py`` ``HybridLinearKVPool``): the full-attention
layers only; the recurrent state lives in the ``MambaPool``."""

from __future__ import annotations

from poolsim.pools.errors import PoolError
from poolsim.pools.mem_cache.pool.base import KVCache
from poolsim.pools.mem_cache.pool.mha import MHATokenToKVPool
from poolsim.pools.mem_cache.pool.mla import MLATokenToKVPool


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
        self.full_kv_pool: MLATokenToKVPool | MHATokenToKVPool
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
