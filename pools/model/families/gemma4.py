"""Gemma 4 (``models/gemma4_mm.py``, ``gemma4_causal.py``, ``gemma4_vision.py``): sliding-window and full layers
with their own head geometry, a hybrid-SWA pool pair, optionally a parallel MoE block, and a vision tower.

The config states its shapes sliding-window first: ``head_dim`` / ``num_key_value_heads`` are the windowed
layers', ``global_head_dim`` / ``num_global_key_value_heads`` the full layers'. SGLang flattens that split
with full attention as the base and the windowed shapes as ``swa_*`` (``utils/hf_transformers/config.py:115-149``),
and sizes the pools by it: Gemma 4 is on the hybrid-SWA allowlist (``configs/model_config.py:2667-2670``),
with its layer ids from ``layer_types`` (``:2754-2765``). ``attention_k_eq_v`` drops ``v_proj`` from the
checkpoint of the full layers, but the loader copies ``k_proj`` into the fused QKV's V shard
(``gemma4_mm.py:970-980``) and the pool keeps a V buffer, so neither weights nor KV bytes shrink.
"""

from __future__ import annotations

from poolsim.pools.model.config import LayerSpec, MoESpec, SWASpec, WeightTensor
from poolsim.pools.model.families.base import Family
from poolsim.pools.model.families.vision import gemma4_vision_tensors, vit_size

_TYPES = {"sliding_attention": True, "full_attention": False}


class Gemma4(Family):

    def __init__(self, cfg: dict, source: str, arch: str):
        super().__init__(cfg, source, arch)
        if arch == "Gemma4ForConditionalGeneration":
            self.cfg = self.need("text_config", cfg, "text_config")
            self.prefix = "text_config."

    def parse_layers(self) -> dict:
        n = self.num_layers()
        # per-layer embeddings (E2B/E4B) and cross-layer KV sharing change both weights and which layers own
        # KV (gemma4_causal.py:395-415, :614-640, :898-925); poolsim does not model them yet
        for key in ("num_kv_shared_layers", "hidden_size_per_layer_input"):
            if self.get_int(key, 0):
                raise ValueError(f"{self.source}: field '{self.prefix}{key}' is {self.cfg[key]}: Gemma 4's "
                                 f"{'cross-layer KV sharing' if key.startswith('num_kv') else 'per-layer embeddings'}"
                                 " is sized by SGLang 0.5.23 and not yet by poolsim")
        types = self.int_list("layer_types", n)
        bad = sorted({t for t in types if t not in _TYPES}, key=str)
        if bad:
            raise ValueError(f"{self.source}: field '{self.prefix}layer_types' has {bad}; expected "
                             "sliding_attention or full_attention")
        h = self.need_int("hidden_size")
        heads = self.need_int("num_attention_heads")
        swa_dim, swa_kv = self.need_int("head_dim"), self.need_int("num_key_value_heads")
        full_dim = self.get_int("global_head_dim", swa_dim, minimum=1)
        full_kv = self.get_int("num_global_key_value_heads", swa_kv, minimum=1)
        windowed = [_TYPES[t] for t in types]
        moe = None
        mlp = "dense"
        if self.get("enable_moe_block", False):
            experts = self.need_int("num_experts")
            # Gemma4MoE: gated GELU experts on the hidden size, softmax routing with a per-expert scale
            # (gemma4_causal.py:218-306); the router is a replicated bf16 projection (:194-200)
            moe = MoESpec(num_experts=experts, top_k=self.need_int("top_k_experts"),
                          intermediate_size=self.need_int("moe_intermediate_size"))
            mlp = "moe+dense"  # the dense MLP runs beside the MoE block in every layer (:583-670)
        layers = tuple(LayerSpec("attention", mlp, self.need_int("sliding_window") if w else 0) for w in windowed)
        n_swa = sum(windowed)
        W = WeightTensor
        # per layer: v_norm (a weightless Gemma4RMSNorm keeps a ones buffer, layers/layernorm.py:1402-1405),
        # layer_scalar (a persistent one-element buffer, gemma4_causal.py:672)
        extra = [W("attn.v_norm", full_dim, 1, n - n_swa, runtime_copy=True),
                 W("attn.swa.v_norm", swa_dim, 1, n_swa, runtime_copy=True),
                 W("layer_scalar", 1, 1, n)]
        norms = 4  # input, post-attention, pre- and post-feedforward (:602-612)
        if moe is not None:
            norms += 3  # post_feedforward_layernorm_1/_2, pre_feedforward_layernorm_2 (:656-664)
            extra += [W("moe.router.scale", h, 1, n),  # Gemma4Router.scale (:186)
                      W("moe.router.norm", h, 1, n, runtime_copy=True),  # its weightless norm's buffer
                      W("moe.per_expert_scale", moe.num_experts, 1, n)]  # Gemma4MoE (:246)
        vision = self.top.get("vision_config") if self.arch.endswith("ForConditionalGeneration") else None
        if vision:
            extra += gemma4_vision_tensors(vision, h, self.source)
        if self.top.get("audio_config"):
            raise ValueError(f"{self.source}: field 'audio_config': Gemma 4's audio tower is loaded by SGLang 0.5.23 "
                             "(gemma4_mm.py:213-222) and its weights are not yet counted by poolsim")
        attn = dict(attention_arch="mha", head_dim=full_dim, v_head_dim=full_dim, num_key_value_heads=full_kv,
                    attention_bias=bool(self.get("attention_bias", False)), qk_norm=True)  # q_norm, k_norm
        return dict(**attn, layers=layers, intermediate_size=self.need_int("intermediate_size"), moe=moe,
                    norms_per_layer=norms, extra_weights=tuple(extra),
                    swa=SWASpec(num_key_value_heads=swa_kv, head_dim=swa_dim, v_head_dim=swa_dim, hybrid_pool=True,
                                num_attention_heads=heads),
                    # Gemma4TextScaledWordEmbedding is an nn.Embedding (gemma4_causal.py:886-893); tied to the
                    # LM head at pp 1 (gemma4_mm.py:254-262)
                    embed_replicated=True,
                    tie_word_embeddings=bool(self.get("tie_word_embeddings", True)),
                    is_multimodal=self.arch == "Gemma4ForConditionalGeneration",
                    vit_size=vit_size(vision) if vision else None)
