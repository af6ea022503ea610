"""Hybrid-SWA KV storage (``swa_memory_pool.py`` ``SWAKVPool``): a full pool and a sliding-window pool."""

from __future__ import annotations

from poolsim.pools.errors import PoolError
from poolsim.pools.mem_cache.pool.base import KVCache
from poolsim.pools.mem_cache.pool.mha import MHATokenToKVPool


class SWAKVPool(KVCache):
    """Two MHA pools for a hybrid-SWA model (``mem_cache/swa_memory_pool.py:21-134``): ``full_kv_pool``
    (``size`` tokens, the full-attention layers) and ``swa_kv_pool`` (``size_swa`` tokens, the windowed
    layers, with their own head geometry). ``layer_id`` maps to the dense index of its pool."""

    def __init__(self, size: int, size_swa: int, page_size: int, dtype: str, full_attention_layer_ids: list[int],
                 swa_attention_layer_ids: list[int], head_num: int, head_dim: int, v_head_dim: int,
                 swa_head_num: int, swa_head_dim: int, swa_v_head_dim: int, device: str | None = None):
        super().__init__(size, page_size, dtype, len(full_attention_layer_ids) + len(swa_attention_layer_ids), device)
        self.size_swa = size_swa
        self.layers_mapping = {lid: (i, False) for i, lid in enumerate(full_attention_layer_ids)}
        self.layers_mapping.update({lid: (i, True) for i, lid in enumerate(swa_attention_layer_ids)})
        self.full_kv_pool = MHATokenToKVPool(size, page_size, dtype, head_num, head_dim,
                                             len(full_attention_layer_ids), device, v_head_dim)
        self.swa_kv_pool = MHATokenToKVPool(size_swa, page_size, dtype, swa_head_num, swa_head_dim,
                                            len(swa_attention_layer_ids), device, swa_v_head_dim)

    def pool_of(self, layer_id: int) -> tuple[MHATokenToKVPool, int]:
        try:
            index, is_swa = self.layers_mapping[layer_id]
        except KeyError:
            raise PoolError(f"layer {layer_id} is not an attention layer of this SWA pool") from None
        return (self.swa_kv_pool if is_swa else self.full_kv_pool), index

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """K and V bytes of both pools together (``SWAKVPool mem usage``)."""
        fk, fv = self.full_kv_pool.get_kv_size_bytes()
        sk, sv = self.swa_kv_pool.get_kv_size_bytes()
        return fk + sk, fv + sv

    def cell_size_bytes(self) -> int:
        """Bytes per token if a token sat in both pools (the ratio-weighted sizing cell is the configurator's)."""
        return self.full_kv_pool.cell_size_bytes() + self.swa_kv_pool.cell_size_bytes()
