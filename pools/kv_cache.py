"""KV storage pools (``memory_pool.py``): they know their byte sizes; on a torch device they own the buffers.

Rows per layer are ``size + page_size``: the first page is the padding page that slot 0 lives in.
MHA/GQA heads are per tp rank; MLA stores the full latent on every rank; the hybrid pool holds
the full-attention layers only (the recurrent state lives in the ``MambaPool``).
"""

from __future__ import annotations

from typing import ClassVar

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
