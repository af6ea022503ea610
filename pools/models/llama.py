"""Dense GQA/MHA decoders: Llama, Mistral, Qwen2, Qwen3 (``models/llama.py``, ``qwen2.py``, ``qwen3.py``)."""

from __future__ import annotations

from pools.models import register
from pools.models.base import Family


@register
class DenseDecoder(Family):
    architectures = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")

    def parse_layers(self) -> dict:
        n = self.num_layers()
        return dict(**self.mha(), layers=self.attention_layers(["dense"] * n),
                    intermediate_size=self.need_int("intermediate_size"))
