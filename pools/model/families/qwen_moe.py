"""Qwen3-MoE (``models/qwen3_moe.py``): GQA attention, routed experts on the decoder_sparse_step grid."""

from __future__ import annotations

from poolsim.pools.model.config import MoESpec
from poolsim.pools.model.families.base import Family


class Qwen3Moe(Family):

    def parse_layers(self) -> dict:
        n = self.num_layers()
        moe = MoESpec(num_experts=self.need_int("num_experts"), top_k=self.need_int("num_experts_per_tok"),
                      intermediate_size=self.need_int("moe_intermediate_size"),
                      shared_intermediate_size=self.get_int("shared_expert_intermediate_size", 0))
        return dict(**self.mha(), layers=self.attention_layers(self.qwen_sparse_layers(n)),
                    intermediate_size=self.get_int("intermediate_size", 0), moe=moe)
