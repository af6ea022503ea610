"""MLA + MoE decoders on DeepSeek-V2's attention (``models/deepseek_v2.py``, ``glm4_moe_lite.py``, ``glm4_moe.py``).

DeepSeek-V3.2 and GLM-5 add the DSA indexer (``layers/attention/dsa/dsa_indexer.py``): its weights per layer and
the index-key cache its pool keeps beside the latent KV.
"""

from __future__ import annotations

from poolsim.pools.model.config import DSASpec, MoESpec, WeightTensor
from poolsim.pools.model.families.base import Family


DSA_ARCHS = ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")


class DeepseekV2(Family):

    def parse_layers(self) -> dict:
        n = self.num_layers()
        inter = self.need_int("moe_intermediate_size")
        # Glm4MoeLiteGate keeps its router weight in float32 (glm4_moe_lite.py:150-165)
        router = 4 if self.arch == "Glm4MoeLiteForCausalLM" else None
        moe = MoESpec(num_experts=self.need_int("n_routed_experts"), top_k=self.need_int("num_experts_per_tok"),
                      intermediate_size=inter, shared_intermediate_size=inter * self.get_int("n_shared_experts", 0),
                      score_bias=self.get("topk_method") == "noaux_tc", router_dtype_bytes=router)
        fields = dict(**self.mla(), layers=self.attention_layers(self.deepseek_sparse_layers(n)),
                      intermediate_size=self.need_int("intermediate_size"), moe=moe)
        # GLM-5 (GlmMoeDsaForCausalLM subclasses DeepseekV2ForCausalLM, glm4_moe.py:1284) carries the same
        # indexer; is_deepseek_dsa keys on the architecture and index_topk (configs/model_config.py:191-212)
        if self.arch in DSA_ARCHS and self.cfg.get("index_topk") is not None:
            fields.update(self.dsa(n, fields["q_lora_rank"]))
        return fields

    def dsa(self, n: int, q_lora_rank: int | None) -> dict:
        heads, dim = self.need_int("index_n_heads"), self.need_int("index_head_dim")
        if not q_lora_rank:
            raise ValueError(f"{self.source}: missing field 'q_lora_rank' needed for the DSA indexer")
        h = self.need_int("hidden_size")
        W = WeightTensor
        # Indexer.__init__ (dsa_indexer.py:344-385), unfused path: wq_b and wk quantized with the model,
        # weights_proj in bf16, k_norm a float32 LayerNorm (weight + bias); replicated on every rank.
        extra = (W("dsa.wq_b", heads * dim, q_lora_rank, n, quantized=True),
                 W("dsa.wk", dim, h, n, quantized=True),
                 W("dsa.weights_proj", heads, h, n, dtype_bytes=2),
                 W("dsa.k_norm", 2 * dim, 1, n, dtype_bytes=4))
        return dict(dsa=DSASpec(index_n_heads=heads, index_head_dim=dim,
                                index_topk=self.need_int("index_topk")), extra_weights=extra)
