"""MLA plus DeepSeek sparse attention's index cache (``memory_pool.py`` ``DSATokenToKVPool``)."""

from __future__ import annotations

from typing import ClassVar

from poolsim.pools.mem_cache.pool.mla import MLATokenToKVPool


class DSATokenToKVPool(MLATokenToKVPool):
    """DeepSeek sparse attention: the MLA latent plus the indexer's key cache (``memory_pool.py:5279-5388``).

    The latent row is ``kv_cache_dim`` bytes wide when the FP8 layout carries per-block scales (656 for
    V3.2) and ``kv_lora_rank + qk_rope_head_dim`` elements otherwise. The index-K cache keeps, per layer,
    ``(size + page + 1) // page`` pages of ``page * (index_head_dim + index_head_dim / 128 * 4)`` uint8
    (``index_key_cache.py:21-47``; index_kpool 1, no dcp). The logged "KV size" counts both.
    """

    quant_block_size: ClassVar[int] = 128  # ClassVar: read off the class (pool_configurator), also when compiled
    scale_bytes: ClassVar[int] = 4  # one float32 scale per quant block

    def __init__(self, size: int, page_size: int, dtype: str, kv_lora_rank: int, qk_rope_head_dim: int,
                 layer_num: int, index_head_dim: int, kv_cache_dim_bytes: int | None = None,
                 device: str | None = None):
        super().__init__(size, page_size, dtype, kv_lora_rank, qk_rope_head_dim, layer_num, device)
        self.index_head_dim = index_head_dim
        # B per token per layer of the latent row: the scaled FP8 layout, or the raw one in the store dtype
        self.latent_row_bytes = kv_cache_dim_bytes or self.kv_cache_dim * self.store_bytes
        self.index_row_bytes = index_head_dim + index_head_dim // self.quant_block_size * self.scale_bytes

    @property
    def index_num_pages(self) -> int:
        return (self.size + self.page_size + 1) // self.page_size

    def index_k_size_bytes(self) -> int:
        return self.layer_num * self.index_num_pages * self.page_size * self.index_row_bytes

    def get_kv_size_bytes(self) -> int:
        return self.layer_num * self.rows * self.latent_row_bytes + self.index_k_size_bytes()

    def cell_size_bytes(self) -> int:
        """pool_configurator.py:385-409: latent bytes plus the index row, over all layers."""
        return (self.latent_row_bytes + self.index_row_bytes) * self.layer_num
