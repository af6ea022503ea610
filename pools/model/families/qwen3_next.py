"""Gated DeltaNet hybrids: Qwen3-Next and Qwen3.5 (``configs/qwen3_next.py``, ``configs/qwen3_5.py``).

Qwen3.5 wraps the text model in ``text_config`` (``Qwen3_5TextConfig`` subclasses ``Qwen3NextConfig``),
so both size their layers by ``full_attention_interval`` (``Qwen3NextConfig.layers_block_type``); a
``layer_types`` list that disagrees with it is refused rather than guessed at.
"""

from __future__ import annotations

from poolsim.pools.model.config import LayerSpec, LinearAttnSpec, MoESpec
from poolsim.pools.model.families.base import Family
from poolsim.pools.model.families.vision import qwen3_vl_vision_tensors, vit_size


class Qwen3Next(Family):

    def __init__(self, cfg: dict, source: str, arch: str):
        super().__init__(cfg, source, arch)
        if arch.startswith("Qwen3_5") and "text_config" in cfg:
            self.cfg = self.need("text_config")
            self.prefix = "text_config."

    def parse_layers(self) -> dict:
        n = self.num_layers()
        interval = self.need_int("full_attention_interval")
        kinds = ["attention" if (i + 1) % interval == 0 else "gdn" for i in range(n)]
        declared = self.cfg.get("layer_types")
        if declared is not None:
            names = {"full_attention": "attention", "linear_attention": "gdn"}
            if [names.get(t, t) for t in declared] != kinds:
                raise ValueError(f"{self.source}: field '{self.prefix}layer_types' disagrees with "
                                 f"full_attention_interval {interval}, which SGLang 0.5.23 sizes by")
        linear = LinearAttnSpec(kind="gdn", num_heads=self.need_int("linear_num_value_heads"),
                                head_dim=self.need_int("linear_value_head_dim"),
                                num_k_heads=self.need_int("linear_num_key_heads"),
                                head_k_dim=self.need_int("linear_key_head_dim"),
                                conv_kernel=self.need_int("linear_conv_kernel_dim"))
        moe = None
        mlp = ["dense"] * n
        if self.cfg.get("num_experts"):
            shared = self.get_int("shared_expert_intermediate_size", 0)
            moe = MoESpec(num_experts=self.need_int("num_experts"), top_k=self.need_int("num_experts_per_tok"),
                          intermediate_size=self.need_int("moe_intermediate_size"),
                          shared_intermediate_size=shared, shared_expert_gate=shared > 0)
            mlp = self.qwen_sparse_layers(n)
        inter = self.get_int("intermediate_size", 0) if moe else self.need_int("intermediate_size")
        layers = tuple(LayerSpec(k, m) for k, m in zip(kinds, mlp))
        vision = self.top.get("vision_config") if self.arch.endswith("ForConditionalGeneration") else None
        extra = qwen3_vl_vision_tensors(vision, self.source) if vision else ()
        # mamba2_state_dtype reads config.mamba_ssm_dtype, or text_config's (configs/mamba_utils.py:47-107)
        # the ForConditionalGeneration wrappers are multimodal (configs/model_config.py:2439-2440) and on the
        # breakable prefill-graph allowlist (:2506-2507)
        multimodal = self.arch.endswith("ForConditionalGeneration")
        return dict(**self.mha(), layers=layers, linear_attn=linear, moe=moe, intermediate_size=inter,
                    attn_output_gate=bool(self.get("attn_output_gate", True)),
                    mamba_ssm_dtype=self.cfg.get("mamba_ssm_dtype"), extra_weights=extra,
                    is_multimodal=multimodal, multimodal_prefill_graph=multimodal,
                    vit_size=vit_size(vision) if vision else None)
