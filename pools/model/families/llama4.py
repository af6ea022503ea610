"""Llama 4 (``models/llama4.py``, ``mllama4.py``): GQA attention where three layers in four attend within a chunk
of ``attention_chunk_size`` tokens, routed experts beside a shared expert.

SGLang sizes the chunked layers as a sliding window: ``Llama4ForConditionalGeneration`` is on the hybrid-SWA
allowlist (``configs/model_config.py:2651-2656``), the windowed layers are every ``(i + 1) % 4 != 0``
(``:2705-2711``) and the window is ``attention_chunk_size`` (``load_model_utils.py:143-156``). Multimodal is off
unless ``--enable-multimodal`` (``configs/model_config.py:690-704``), and then ``Llama4ForConditionalGeneration``
builds no vision tower (``mllama4.py:468-491``): its weights are not loaded, and nothing is reserved for it.
"""

from __future__ import annotations

from poolsim.pools.model.config import LayerSpec, MoESpec, SWASpec
from poolsim.pools.model.families.base import Family


class Llama4(Family):

    def __init__(self, cfg: dict, source: str, arch: str):
        super().__init__(cfg, source, arch)
        if arch == "Llama4ForConditionalGeneration":
            self.cfg = self.need("text_config", cfg, "text_config")
            self.prefix = "text_config."

    def parse_layers(self) -> dict:
        n = self.num_layers()
        chunk = self.need_int("attention_chunk_size")
        step = self.get_int("interleave_moe_layer_step", 1)
        # Llama4DecoderLayer._is_moe_layer (llama4.py:438-441); the dense layers use intermediate_size_mlp
        mlp = ["moe" if step and (i + 1) % step == 0 else "dense" for i in range(n)]
        experts = self.need_int("num_local_experts")
        inter = self.need_int("intermediate_size")
        # Llama4MoE: a bf16 router, gated experts of intermediate_size, a shared LlamaMLP of the same width
        # (llama4.py:105-145)
        moe = MoESpec(num_experts=experts, top_k=self.need_int("num_experts_per_tok"), intermediate_size=inter,
                      shared_intermediate_size=inter)
        attn = self.mha()
        attn["qk_norm"] = False  # Llama4Attention's qk_norm is an RMSNorm without weight (llama4.py:246-254)
        # hybrid layer ids: (i + 1) % 4 != 0 windowed (configs/model_config.py:2705-2711)
        layers = tuple(LayerSpec("attention", m, chunk if (i + 1) % 4 else 0) for i, m in enumerate(mlp))
        return dict(**attn, layers=layers, moe=moe,
                    intermediate_size=self.get_int("intermediate_size_mlp", 0) if "dense" in mlp else 0,
                    swa=SWASpec(attn["num_key_value_heads"], attn["head_dim"], attn["v_head_dim"], hybrid_pool=True))
