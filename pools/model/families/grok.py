"""Grok-1/Grok-2 (``models/grok.py``): GQA attention; each layer has routed experts plus, with
``residual_moe``, a dense SwiGLU MLP beside them; four RMSNorms per layer; a float32 router."""

from __future__ import annotations

from poolsim.pools.model.config import LayerSpec, MoESpec, WeightTensor
from poolsim.pools.model.families.base import Family


class Grok1(Family):

    def parse_layers(self) -> dict:
        n = self.num_layers()
        h = self.need_int("hidden_size")
        residual = bool(self.get("residual_moe", False))
        inter = self.need_int("intermediate_size")
        moe = MoESpec(num_experts=self.need_int("num_local_experts"), top_k=self.need_int("num_experts_per_tok"),
                      intermediate_size=self.get_int("moe_intermediate_size", inter, minimum=1),
                      router_dtype_bytes=4)  # Grok1MoE.gate: params_dtype float32 (grok.py:139-145)
        attn = self.mha()
        attn["head_dim"] = attn["v_head_dim"] = self.get_int("head_dim", 128, minimum=1)  # grok.py:359
        # pre/post attention and pre/post MoE norms (grok.py:537-540); the generic count has two
        extra = (WeightTensor("norms.post_attn_post_moe", h, 1, 2 * n),)
        return dict(**attn, layers=tuple(LayerSpec("attention", "moe+dense" if residual else "moe") for _ in range(n)),
                    intermediate_size=inter if residual else 0, moe=moe, extra_weights=extra)
