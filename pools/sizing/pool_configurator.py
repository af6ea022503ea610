"""One sizing term per KV pool kind, as SGLang 0.5.23 keeps them apart (``model_executor/pool_configurator.py``).

A configurator knows the pool its model gets (MHA, MLA, the hybrid linear-attention pool, DSA's latent +
index-K pool, or the full + SWA pair), the bytes one token costs there, and how a byte budget becomes
token counts. ``pool_configurator`` picks one the way ``create_memory_pool_configurator`` (``:1715-1725``)
does. With an EAGLE/STANDALONE draft (``draft_layers`` > 0) the byte budget is shared with the draft's pool of the
same token count: the cell the budget divides by grows by the draft's share (``draft_cell_size``).
"""

from __future__ import annotations

from dataclasses import dataclass

from poolsim.pools.errors import SizingError
from poolsim.pools.mem_cache.pool.base import KVCache
from poolsim.pools.mem_cache.pool.dsa import DSATokenToKVPool
from poolsim.pools.mem_cache.pool.hybrid import HybridLinearKVPool
from poolsim.pools.mem_cache.pool.mha import MHATokenToKVPool
from poolsim.pools.mem_cache.pool.mla import MLATokenToKVPool
from poolsim.pools.mem_cache.pool.swa import SWAKVPool
from poolsim.pools.model.config import ModelConfig

SWA_FULL_TOKENS_RATIO = 0.8  # --swa-full-tokens-ratio default, arg_groups/fields/schedule.py:150-162
DSA_PAGE_SIZE = 64  # DSATokenToKVPool's physical page (memory_pool.py:5371); the DeepSeek override sets it


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """get_num_kv_heads / get_swa_num_kv_heads (configs/model_config.py:1700-1724): max(1, heads // tp)."""
    return max(1, num_kv_heads // tp)


def floor_page(tokens: int, page_size: int) -> int:
    return tokens // page_size * page_size


@dataclass(frozen=True)
class PoolSizes:
    max_total_num_tokens: int  # the full side: what the scheduler reports
    swa_max_total_num_tokens: int | None = None  # the SWA pool (hybrid SWA only)


class DefaultPoolConfigurator:
    """``DefaultPoolConfigurator`` (``:637``): tokens = bytes // cell, page-floored.

    An EAGLE/STANDALONE draft of ``draft_layers`` layers adds ``int(cell x draft_layers / layers)`` to the cell
    (``:255-314``): layer-count scaling, which assumes the draft's per-layer KV size is the target's; ``layers``
    are the full-attention layers (hybrids: mambaish ``full_attention_layer_ids``, ``:228-237``)."""

    def __init__(self, model: ModelConfig, tp: int, page_size: int, dtype: str, draft_layers: int = 0):
        self.model = model
        self.tp = tp
        self.page_size = page_size
        self.dtype = dtype
        self.draft_layers = draft_layers

    def kv_pool(self, size: int, swa_size: int | None = None) -> KVCache:
        m, tp, page, dtype = self.model, self.tp, self.page_size, self.dtype
        heads = kv_heads_per_rank(m.num_key_value_heads, tp)
        if m.is_hybrid:
            return HybridLinearKVPool(size, page, dtype, m.full_attention_layer_ids, mamba_pool=None,
                                      use_mla=m.use_mla, head_num=heads, head_dim=m.head_dim, v_head_dim=m.v_head_dim,
                                      kv_lora_rank=m.kv_lora_rank, qk_rope_head_dim=m.qk_rope_head_dim)
        layers = len(m.full_attention_layer_ids)
        if m.use_mla:
            return MLATokenToKVPool(size, page, dtype, m.kv_lora_rank, m.qk_rope_head_dim, layers)
        return MHATokenToKVPool(size, page, dtype, heads, m.head_dim, layers, v_head_dim=m.v_head_dim)

    def target_cell_size(self) -> float:
        """Bytes per token of the target's own pool on one rank."""
        return self.kv_pool(0).cell_size_bytes()

    def draft_cell_size(self) -> float:
        """What the draft adds to the cell the budget divides by (0 without a draft)."""
        layers = len(self.model.full_attention_layer_ids)
        if self.draft_layers <= 0 or layers <= 0:
            return 0
        return int(self.target_cell_size() * self.draft_layers / layers)  # pool_configurator.py:304-312

    def cell_size(self) -> float:
        """Bytes per token of max_total_num_tokens on one rank: the target's, plus the draft's share."""
        return self.target_cell_size() + self.draft_cell_size()

    def calculate_pool_sizes(self, available_bytes: int) -> PoolSizes:
        return PoolSizes(floor_page(int(available_bytes // self.cell_size()), self.page_size))

    def from_max_tokens(self, max_total_num_tokens: int) -> PoolSizes:
        """``calculate_pool_sizes_from_max_tokens`` (``:918-921``): the capped token count."""
        return PoolSizes(floor_page(max_total_num_tokens, self.page_size))


class DSAPoolConfigurator(DefaultPoolConfigurator):
    """DeepSeek-V3.2: the MLA latent plus the index-K cache (``:385-409``, ``:560-634``).

    The latent row is the scaled FP8 layout (``kv_lora_rank + kv_lora_rank / 128 * 4 + rope * 2`` bytes,
    ``calculate_mla_kv_cache_dim``, kv_cache_configurator.py:3412-3473) only with an FP8 KV cache on the
    flashmla_kv kernels (Hopper's FP8 default); Blackwell's trtllm, the HIP kernels and a bf16 cache use
    the raw ``kv_lora_rank + rope`` elements.
    """

    def __init__(self, model: ModelConfig, tp: int, page_size: int, dtype: str, gpu_arch: str,
                 draft_layers: int = 0):
        super().__init__(model, tp, page_size, dtype, draft_layers)
        self.scaled_layout = dtype == "fp8_e4m3" and gpu_arch not in ("sm100", "gfx942")

    @property
    def latent_row_bytes(self) -> int | None:
        m = self.model
        if not self.scaled_layout:
            return None
        block = DSATokenToKVPool.quant_block_size
        return m.kv_lora_rank + m.kv_lora_rank // block * DSATokenToKVPool.scale_bytes + m.qk_rope_head_dim * 2

    def kv_pool(self, size: int, swa_size: int | None = None) -> KVCache:
        m = self.model
        return DSATokenToKVPool(size, self.page_size, self.dtype, m.kv_lora_rank, m.qk_rope_head_dim,
                                len(m.full_attention_layer_ids), m.dsa.index_head_dim,
                                kv_cache_dim_bytes=self.latent_row_bytes)

    def draft_cell_size(self) -> float:
        """pool_configurator.py:274-302: the latent part scaled by layers, plus the index-K rows of every draft
        layer."""
        layers = len(self.model.full_attention_layer_ids)
        if self.draft_layers <= 0 or layers <= 0:
            return 0
        pool = self.kv_pool(0)
        indexer = pool.index_row_bytes * layers
        latent = pool.cell_size_bytes() - indexer
        return int(latent * self.draft_layers / layers) + pool.index_row_bytes * self.draft_layers


class HybridSWAPoolConfigurator(DefaultPoolConfigurator):
    """``HybridSWAPoolConfigurator`` (``:655-916``): one budget split between a full and an SWA pool.

    ``cell = F_tok * n_full + ratio * S_tok * n_swa``; ``full = floor_page(int(bytes // cell))``,
    ``swa = floor_page(int(full * ratio))``; an SWA pool no larger than ``window + page`` is refused.
    """

    def __init__(self, model: ModelConfig, tp: int, page_size: int, dtype: str, ratio: float,
                 draft_layers: int = 0):
        super().__init__(model, tp, page_size, dtype, draft_layers)
        if not 0 < ratio <= 1:  # arg_groups/kv_cache_hook.py:427
            raise SizingError(f"--swa-full-tokens-ratio {ratio} is not in (0, 1]")
        self.ratio = ratio
        full_ids = set(model.full_attention_layer_ids) - set(model.swa_layer_ids)
        self.full_layer_ids = sorted(full_ids)
        self.swa_layer_ids = model.swa_layer_ids

    def kv_pool(self, size: int, swa_size: int | None = None) -> SWAKVPool:
        m, swa = self.model, self.model.swa
        swa_size = int(size * self.ratio) if swa_size is None else swa_size
        return SWAKVPool(size, swa_size, self.page_size, self.dtype, self.full_layer_ids, self.swa_layer_ids,
                         kv_heads_per_rank(m.num_key_value_heads, self.tp), m.head_dim, m.v_head_dim,
                         kv_heads_per_rank(swa.num_key_value_heads, self.tp), swa.head_dim, swa.v_head_dim)

    def per_token(self) -> tuple[int, int]:
        """(F_tok, S_tok): bytes per token per layer of a full and of an SWA layer, on one rank (:705-716)."""
        pool = self.kv_pool(0, 0)
        full, swa = pool.full_kv_pool, pool.swa_kv_pool
        return (full.head_num * (full.head_dim + full.v_head_dim) * full.store_bytes,
                swa.head_num * (swa.head_dim + swa.v_head_dim) * swa.store_bytes)

    def target_cell_size(self) -> float:
        full_tok, swa_tok = self.per_token()
        if not self.full_layer_ids:  # all-SWA: the ratio is not used (:786-803)
            return swa_tok * len(self.swa_layer_ids)
        return full_tok * len(self.full_layer_ids) + self.ratio * swa_tok * len(self.swa_layer_ids)

    def draft_cell_size(self) -> float:
        """A draft without windowed layers of its own sits on the full side (``_draft_full_layers_num``,
        :733-759; ``_recompute_cell_size``, :778-803)."""
        return self.per_token()[0] * max(self.draft_layers, 0)

    def cell_size(self) -> float:
        return self.target_cell_size() + self.draft_cell_size()

    def calculate_pool_sizes(self, available_bytes: int) -> PoolSizes:
        return self.from_max_tokens(int(available_bytes // self.cell_size()))

    def from_max_tokens(self, max_total_num_tokens: int) -> PoolSizes:
        """``_solve_pool_sizes`` (``:859-893``)."""
        page = self.page_size
        if not self.full_layer_ids:  # all-SWA: max_total_num_tokens is the SWA pool
            tokens = floor_page(max_total_num_tokens, page)
            return PoolSizes(tokens, tokens)
        full = floor_page(max_total_num_tokens, page)
        swa = floor_page(int(full * self.ratio), page)
        window = self.model.sliding_window
        if window + page >= swa:  # validate_swa_pool_size (:197-216)
            raise SizingError(f"--swa-full-tokens-ratio {self.ratio}: the SWA pool ({swa} tokens) cannot hold "
                                  f"one request; SGLang needs more than sliding_window ({window}) + page_size ({page})")
        return PoolSizes(full, swa)


def pool_configurator(model: ModelConfig, tp: int, page_size: int, dtype: str, *, gpu_arch: str = "sm90",
                      swa_full_tokens_ratio: float = SWA_FULL_TOKENS_RATIO,
                      draft_layers: int = 0) -> DefaultPoolConfigurator:
    """``draft_layers``: the EAGLE/STANDALONE draft's ``eagle_draft_num_layers`` (0: no draft)."""
    if model.is_hybrid_swa:
        return HybridSWAPoolConfigurator(model, tp, page_size, dtype, swa_full_tokens_ratio, draft_layers)
    if model.dsa is not None:
        return DSAPoolConfigurator(model, tp, page_size, dtype, gpu_arch, draft_layers)
    return DefaultPoolConfigurator(model, tp, page_size, dtype, draft_layers)
