"""LFM2 (``configs/lfm2.py``, ``models/lfm2.py``): short-convolution layers and GQA attention layers.

A conv layer keeps only a causal-conv window per request: SGLang builds its state as a Mamba2 shape
with ``state_size`` 0 (``Lfm2Config.mamba2_cache_params``), so the temporal state has no elements.
"""

from __future__ import annotations

from poolsim.pools.model.config import LayerSpec, LinearAttnSpec
from poolsim.pools.model.families.base import Family


class Lfm2(Family):

    def parse_layers(self) -> dict:
        n = self.num_layers()
        types = self.cfg.get("layer_types")
        if types is None:  # HF Lfm2Config: full_attn_idxs, else every layer attention
            full = set(self.cfg.get("full_attn_idxs", range(n)))
            types = ["full_attention" if i in full else "conv" for i in range(n)]
        elif not isinstance(types, list) or len(types) != n:
            raise ValueError(f"{self.source}: field 'layer_types' is not a list of {n} entries")
        kinds = {"full_attention": "attention", "conv": "short_conv", "short_conv": "short_conv"}
        bad = sorted({t for t in types if t not in kinds}, key=str)
        if bad:
            raise ValueError(f"{self.source}: field 'layer_types' has {bad}; expected full_attention or conv")
        hidden = self.need_int("hidden_size")
        linear = LinearAttnSpec(kind="short_conv", num_heads=1, head_dim=hidden, num_k_heads=1, head_k_dim=0,
                                conv_kernel=self.get_int("conv_L_cache", 3, minimum=2))
        # Lfm2Attention has q_layernorm/k_layernorm (models/lfm2.py:168); HF Lfm2Config ties embeddings by default
        return {**self.mha(), "qk_norm": True, "layers": tuple(LayerSpec(kinds[t], "dense") for t in types),
                "linear_attn": linear, "intermediate_size": self.ff_dim(),
                "tie_word_embeddings": bool(self.get("tie_embedding", self.get("tie_word_embeddings", True)))}

    def ff_dim(self) -> int:
        """Lfm2MLP's width (models/lfm2.py:73-84): block_ff_dim, two thirds of it, rounded up to block_multiple_of."""
        inter = self.cfg.get("block_ff_dim", self.cfg.get("intermediate_size"))
        inter = self.check_int(inter, "block_ff_dim")
        if self.get("block_auto_adjust_ff_dim", True):
            inter = int(2 * inter / 3)
            multiplier = self.cfg.get("block_ffn_dim_multiplier", 1.0)
            if multiplier is not None:
                multiple = self.get_int("block_multiple_of", 256, minimum=1)
                inter = int(multiplier * inter)
                inter = multiple * ((inter + multiple - 1) // multiple)
        return inter
