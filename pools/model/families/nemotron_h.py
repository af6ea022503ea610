"""Nemotron-H (``configs/nemotron_h.py``): Mamba2, attention, MLP and MoE blocks per ``hybrid_override_pattern``;
Nemotron-3 Super's experts work in a ``moe_latent_size``-wide latent."""

from __future__ import annotations

from poolsim.pools.model.config import LayerSpec, LinearAttnSpec, MoESpec
from poolsim.pools.model.families.base import Family


class NemotronH(Family):

    def num_layers(self) -> int:
        return 0  # NemotronHConfig.num_hidden_layers is len(layers_block_type) (configs/nemotron_h.py:441)

    def parse_layers(self) -> dict:
        pattern = self.cfg.get("hybrid_override_pattern")
        if pattern is None and self.cfg.get("layers_block_type"):
            names = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
            pattern = "".join(names.get(t, "?") for t in self.cfg["layers_block_type"])
        if pattern is None:
            raise ValueError(f"{self.source}: missing field 'hybrid_override_pattern' needed for {self.arch}")
        kinds = {"M": LayerSpec("mamba2", "none"), "*": LayerSpec("attention", "none"),
                 "-": LayerSpec("none", "dense"), "E": LayerSpec("none", "moe")}
        bad = sorted(set(pattern) - set(kinds))
        if bad:
            raise ValueError(f"{self.source}: hybrid_override_pattern has {bad}; expected M, *, - or E")
        n_groups = self.cfg.get("n_groups") or self.need("mamba_n_groups")
        linear = LinearAttnSpec(kind="mamba2", num_heads=self.need_int("mamba_num_heads"),
                                head_dim=self.need_int("mamba_head_dim"),
                                num_k_heads=self.check_int(n_groups, "n_groups"),
                                head_k_dim=self.need_int("ssm_state_size"),
                                conv_kernel=self.cfg.get("conv_kernel") or self.get_int("mamba_d_conv", 4))
        moe = None
        if "E" in pattern:
            moe = MoESpec(num_experts=self.need_int("n_routed_experts"), top_k=self.need_int("num_experts_per_tok"),
                          intermediate_size=self.need_int("moe_intermediate_size"),
                          shared_intermediate_size=self.get_int("moe_shared_expert_intermediate_size", 0)
                          * self.get_int("n_shared_experts", 0),
                          gated=False, score_bias=True,
                          # latent MoE (Nemotron-3 Super): NemotronHMoE builds the experts on moe_latent_size
                          # between fc1/fc2_latent_proj, ReplicatedLinear with the checkpoint's quant_config
                          # (models/nemotron_h.py:260-345)
                          latent_size=self.get_int("moe_latent_size", 0))
        return dict(**self.mha(), layers=tuple(kinds[c] for c in pattern), linear_attn=linear, moe=moe,
                    num_hidden_layers=len(pattern), intermediate_size=self.get_int("intermediate_size", 0),
                    dense_mlp_gated=False, mamba_ssm_dtype=self.cfg.get("mamba_ssm_dtype"),
                    norms_per_layer=1)
