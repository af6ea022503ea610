"""A decoder poolsim has no family for: read as Llama-like when nothing in the config says otherwise.

Any field that names a hybrid layer, a windowed, latent or sparse attention, experts or a wrapped text
model is refused by name: sizing it as plain GQA would be silently wrong.
"""

from __future__ import annotations

from poolsim.pools.model.families.base import Family

# fields whose presence means "not a plain decoder", with what they would change
_VARIANT_FIELDS = {
    "layer_types": "per-layer mixers", "layers_block_type": "per-layer mixers",
    "hybrid_override_pattern": "per-layer mixers", "full_attention_interval": "linear-attention layers",
    "linear_attn_config": "linear-attention layers", "full_attn_idxs": "per-layer mixers",
    "sliding_window": "sliding-window attention", "attention_chunk_size": "chunked attention",
    "kv_lora_rank": "latent (MLA) attention", "index_topk": "sparse attention",
    "num_experts": "experts", "n_routed_experts": "experts", "num_local_experts": "experts",
    "moe_intermediate_size": "experts", "text_config": "a wrapped text model",
    "mamba_d_state": "Mamba layers", "ssm_state_size": "Mamba layers",
}
_NEEDED = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size")


class PlainDecoder(Family):
    notes = ("not in poolsim's families: read as a Llama-like decoder (GQA on every layer, SwiGLU MLP, "
             "RMSNorm, no biases, SGLang's default backend and overrides)",)

    @classmethod
    def fallback_for(cls, cfg: dict, source: str, arch: str, supported: tuple[str, ...]) -> type["PlainDecoder"]:
        refuse = f"{source}: architectures[0] {arch!r} is not supported"
        if not arch.endswith("ForCausalLM"):
            raise ValueError(f"{refuse} and is not a causal LM; supported: {', '.join(supported)}")
        for key, what in _VARIANT_FIELDS.items():
            value = cfg.get(key)
            if value is not None and value is not False and not (key == "sliding_window" and value in (-1, 0)):
                raise ValueError(f"{refuse}: field '{key}' means {what}, which poolsim cannot size for it")
        missing = [k for k in _NEEDED if cfg.get(k) is None]
        if missing:
            raise ValueError(f"{refuse}, and as a plain decoder it lacks field '{missing[0]}'")
        return cls

    def parse_layers(self) -> dict:
        n = self.num_layers()
        attn = self.mha()
        attn["attention_bias"] = False
        return dict(**attn, layers=self.attention_layers(["dense"] * n),
                    intermediate_size=self.need_int("intermediate_size"))
