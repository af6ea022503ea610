"""Architecture families: each module parses one family's config.json into the common ``ModelConfig``.

``ARCHITECTURES`` maps the architecture names SGLang dispatches on (``architectures[0]`` of the config) to the
family class that reads them, the way SGLang keeps one model override per family
(``arg_groups/model_overrides/``). A family's module is imported when a config of its architecture is parsed, so
``model/config.py`` and the families never import each other at load time. Adding an architecture is adding one
module here and its names below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from poolsim.pools.model.config import ModelConfig
    from poolsim.pools.model.families.base import Family

ARCHITECTURES = {  # architectures[0] -> "module:Class" in this package
    "DeepseekV2ForCausalLM": "deepseek:DeepseekV2",
    "DeepseekV3ForCausalLM": "deepseek:DeepseekV2",
    "DeepseekV32ForCausalLM": "deepseek:DeepseekV2",
    "Glm4MoeLiteForCausalLM": "deepseek:DeepseekV2",
    "GlmMoeDsaForCausalLM": "deepseek:DeepseekV2",
    "GraniteMoeHybridForCausalLM": "granite_moe_hybrid:GraniteMoeHybrid",
    "Grok1ForCausalLM": "grok:Grok1",
    "KimiK3ForConditionalGeneration": "kimi_k3:KimiK3",
    "KimiLinearForCausalLM": "kimi_linear:KimiLinear",
    "Lfm2ForCausalLM": "lfm2:Lfm2",
    "Llama4ForCausalLM": "llama4:Llama4",
    "Llama4ForConditionalGeneration": "llama4:Llama4",
    "LlamaForCausalLM": "llama:DenseDecoder",
    "LlamaForCausalLMEagle": "eagle:LlamaEagle",  # draft heads (--speculative-draft-model-path)
    "LlamaForCausalLMEagle3": "eagle:LlamaEagle",
    "MistralForCausalLM": "llama:DenseDecoder",
    "Qwen2ForCausalLM": "llama:DenseDecoder",
    "Qwen3ForCausalLM": "llama:DenseDecoder",
    "NemotronHForCausalLM": "nemotron_h:NemotronH",
    "Qwen3NextForCausalLM": "qwen3_next:Qwen3Next",
    "Qwen3_5ForCausalLM": "qwen3_next:Qwen3Next",
    "Qwen3_5ForConditionalGeneration": "qwen3_next:Qwen3Next",
    "Qwen3_5MoeForCausalLM": "qwen3_next:Qwen3Next",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_next:Qwen3Next",
    "Qwen3MoeForCausalLM": "qwen_moe:Qwen3Moe",
    "Gemma4ForCausalLM": "gemma4:Gemma4",
    "Gemma4ForConditionalGeneration": "gemma4:Gemma4",
    "Gemma3ForCausalLM": "sliding_window:Gemma3",
    "Gemma3ForConditionalGeneration": "sliding_window:Gemma3",
    "GptOssForCausalLM": "sliding_window:GptOss",
    "MiMoV2FlashForCausalLM": "sliding_window:MiMoV2",
}


# Architectures SGLang 0.5.23 sizes with a pool kind poolsim does not model yet: refused naming the config
# field that selects it, never sized as something else. arch -> (field, what SGLang builds from it)
_MINIMAX_SPARSE = "MiniMax-M3's sparse-attention KV and index pools (MiniMaxSparseKVPool, mem_cache/memory_pool.py:5847)"
REFUSED = {
    "DeepseekV4ForCausalLM": ("compress_ratios", ("DeepSeek-V4's compressed-KV pools (DSV4PoolConfigurator, "
                                                  "model_executor/pool_configurator.py:1067; "
                                                  "mem_cache/deepseek_v4_memory_pool.py)")),
    "MiniMaxM3SparseForConditionalGeneration": ("text_config.sparse_attention_config", _MINIMAX_SPARSE),
    "MiniMaxM3SparseForCausalLM": ("sparse_attention_config", _MINIMAX_SPARSE),
}


def supported_architectures() -> tuple[str, ...]:
    return tuple(sorted(ARCHITECTURES))


def family_for(arch: str) -> type[Family] | None:
    """The family class that reads ``arch`` (its module imported now), or None for an architecture not listed."""
    entry = ARCHITECTURES.get(arch)
    if entry is None:
        return None
    module, cls = entry.split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def parse(cfg: dict, source: str, name: str) -> ModelConfig:
    archs = cfg.get("architectures")
    if not archs or not isinstance(archs, list) or not isinstance(archs[0], str):
        raise ValueError(f"{source}: missing field 'architectures'")
    arch = archs[0]
    if arch in REFUSED:
        field, what = REFUSED[arch]
        raise ValueError(f"{source}: architectures[0] {arch!r}: field '{field}' selects {what}, which SGLang 0.5.23 "
                         "sizes and poolsim does not model yet")
    family = family_for(arch)
    if family is None:
        from poolsim.pools.model.families.plain_decoder import PlainDecoder

        family = PlainDecoder.fallback_for(cfg, source, arch, supported_architectures())
    return family(cfg, source, arch).parse(name)
