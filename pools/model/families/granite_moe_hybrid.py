"""Granite-4.0-H (``configs/granitemoehybrid.py``, ``models/granitemoehybrid.py``).

Every layer is a Mamba2 or an attention mixer per ``layer_types``, followed by routed experts
(``block_sparse_moe``, when ``num_local_experts`` > 0) plus a shared SwiGLU MLP (``shared_mlp``).
"""

from __future__ import annotations

from poolsim.pools.model.config import LayerSpec, LinearAttnSpec, MoESpec
from poolsim.pools.model.families.base import Family

_KINDS = {"mamba": "mamba2", "linear_attention": "mamba2", "attention": "attention", "full_attention": "attention"}


class GraniteMoeHybrid(Family):

    def parse_layers(self) -> dict:
        n = self.num_layers()
        types = self.int_list("layer_types", n)
        bad = sorted({t for t in types if t not in _KINDS}, key=str)
        if bad:
            raise ValueError(f"{self.source}: field 'layer_types' has {bad}; expected mamba or attention")
        hidden = self.need_int("hidden_size")
        heads = self.get_int("mamba_n_heads", 64, minimum=1)
        inner = self.get_int("mamba_expand", 2, minimum=1) * hidden  # mamba_intermediate_size
        if inner % heads or self.get_int("mamba_d_head", 64, minimum=1) * heads != inner:
            raise ValueError(f"{self.source}: field 'mamba_d_head' x 'mamba_n_heads' must equal "
                             f"mamba_expand x hidden_size ({inner})")
        linear = LinearAttnSpec(kind="mamba2", num_heads=heads, head_dim=inner // heads,
                                num_k_heads=self.get_int("mamba_n_groups", 1, minimum=1),
                                head_k_dim=self.get_int("mamba_d_state", 128, minimum=1),
                                conv_kernel=self.get_int("mamba_d_conv", 4, minimum=2))
        experts = self.get_int("num_local_experts", 0)
        shared = self.get_int("shared_intermediate_size", 8192)
        moe, mlp, inter = None, "dense", shared
        if experts:
            moe = MoESpec(num_experts=experts, top_k=self.need_int("num_experts_per_tok"),
                          intermediate_size=self.need_int("intermediate_size"), shared_intermediate_size=shared)
            mlp, inter = "moe", 0
        layers = tuple(LayerSpec(_KINDS[t], mlp) for t in types)
        return dict(**self.mha(), layers=layers, linear_attn=linear, moe=moe, intermediate_size=inter,
                    mamba_ssm_dtype=self.cfg.get("mamba_ssm_dtype"))
