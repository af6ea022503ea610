"""Kimi Linear (``models/kimi_linear.py``, ``configs/kimi_linear.py``): KDA layers + MLA layers, MoE."""

from __future__ import annotations

from poolsim.pools.model.config import LayerSpec, LinearAttnSpec, MoESpec
from poolsim.pools.model.families.base import Family


class KimiLinear(Family):

    def parse_layers(self) -> dict:
        n = self.num_layers()
        lac = self.need("linear_attn_config")
        kda = set(self.need("kda_layers", lac, "linear_attn_config.kda_layers"))  # 1-based
        heads = self.need_int("num_heads", lac, "linear_attn_config.num_heads")
        head_dim = self.need_int("head_dim", lac, "linear_attn_config.head_dim")
        linear = LinearAttnSpec(kind="kda", num_heads=heads, head_dim=head_dim, num_k_heads=heads,
                                head_k_dim=head_dim,
                                conv_kernel=self.need_int("short_conv_kernel_size", lac,
                                                          "linear_attn_config.short_conv_kernel_size"))
        inter = self.need_int("moe_intermediate_size")
        moe = MoESpec(num_experts=self.need_int("num_experts"), top_k=self.need_int("num_experts_per_token"),
                      intermediate_size=inter, shared_intermediate_size=inter * self.get_int("num_shared_experts", 0),
                      score_bias=True)
        mlp = self.deepseek_sparse_layers(n)
        layers = tuple(LayerSpec("kda" if i + 1 in kda else "attention", mlp[i]) for i in range(n))
        # KimiLinearConfig.mamba2_cache_params passes no config to the dtype helper: the config's
        # mamba_ssm_dtype is never read (configs/kimi_linear.py:172-183).
        return dict(**self.mla(), layers=layers, linear_attn=linear,
                    intermediate_size=self.need_int("intermediate_size"), moe=moe)
