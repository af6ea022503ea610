"""Architecture families: each module parses one family's config.json into the common ``ModelConfig``.

A family registers the architecture names it reads (``architectures[0]`` of the config), the way SGLang
keeps one model override per family (``arg_groups/model_overrides/``). Adding an architecture is adding
one module here and importing it below.
"""

from __future__ import annotations

from poolsim.pools.model.config import ModelConfig
from poolsim.pools.model.families.base import Family

FAMILIES: dict[str, type[Family]] = {}


def register(cls: type[Family]) -> type[Family]:
    for arch in cls.architectures:
        assert arch not in FAMILIES, f"{arch} registered twice"
        FAMILIES[arch] = cls
    return cls


def supported_architectures() -> tuple[str, ...]:
    return tuple(sorted(FAMILIES))


def parse(cfg: dict, source: str, name: str) -> ModelConfig:
    archs = cfg.get("architectures")
    if not archs or not isinstance(archs, list) or not isinstance(archs[0], str):
        raise ValueError(f"{source}: missing field 'architectures'")
    arch = archs[0]
    family = FAMILIES.get(arch)
    if family is None:
        from poolsim.pools.model.families.plain_decoder import PlainDecoder

        family = PlainDecoder.fallback_for(cfg, source, arch, supported_architectures())
    return family(cfg, source, arch).parse(name)


# NOTE: imported for their @register side effect, after FAMILIES exists.
from poolsim.pools.model.families import (  # noqa: E402,F401
    deepseek,
    granite_moe_hybrid,
    grok,
    kimi_linear,
    lfm2,
    llama,
    nemotron_h,
    qwen3_next,
    qwen_moe,
    sliding_window,
)
