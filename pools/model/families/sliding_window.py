"""Sliding-window attention models (``configs/model_config.py`` ``get_hybrid_layer_ids``).

On SGLang 0.5.23's hybrid-SWA allowlist (``is_hybrid_swa_model``) the windowed layers get their own,
smaller KV pool: gpt-oss (``SWA_SINK_ARCHS``: ``layer_types``) and MiMo-V2 (``hybrid_layer_pattern``,
its own ``swa_*`` head geometry). Gemma 2/3 are windowed too, but their model override sets
``disable_hybrid_swa_memory`` (``model_overrides/gemma2_gemma3.py:14-26``): one pool, every layer
sized as full.
"""

from __future__ import annotations

from poolsim.pools.model.config import LayerSpec, MoESpec, SWASpec, WeightTensor
from poolsim.pools.model.families.base import Family


def _window_layers(windowed: list[bool], window: int, mlp: list[str]) -> tuple[LayerSpec, ...]:
    return tuple(LayerSpec("attention", m, window if w else 0) for w, m in zip(windowed, mlp))


class GptOss(Family):

    def parse_layers(self) -> dict:
        n = self.num_layers()
        types = self.int_list("layer_types", n)
        bad = sorted({t for t in types if t not in ("sliding_attention", "full_attention")}, key=str)
        if bad:
            raise ValueError(f"{self.source}: field 'layer_types' has {bad}; expected sliding_attention "
                             "or full_attention")
        experts = self.need_int("num_local_experts")
        top_k = self.cfg.get("num_experts_per_tok", self.cfg.get("experts_per_token"))
        moe = MoESpec(num_experts=experts, top_k=self.check_int(top_k, "num_experts_per_tok"),
                      intermediate_size=self.need_int("intermediate_size"), expert_bias=True)
        attn = self.mha()
        heads = self.need_int("num_attention_heads")
        # the router is a biased linear; every attention layer has one sink logit per head (gpt_oss.py:257, :429)
        extra = (WeightTensor("moe.router_bias", experts, 1, n),
                 WeightTensor("attn.sinks", heads, 1, n, "col"))
        windowed = [t == "sliding_attention" for t in types]
        return dict(**attn, layers=_window_layers(windowed, self.need_int("sliding_window"), ["moe"] * n),
                    intermediate_size=0, moe=moe, extra_weights=extra,
                    dtype="bfloat16",  # _gpt_oss_overrides: mxfp4 checkpoints run in bfloat16
                    swa=SWASpec(attn["num_key_value_heads"], attn["head_dim"], attn["v_head_dim"], hybrid_pool=True))


class MiMoV2(Family):
    notes = ("MiMo-V2: weight bytes count attention, experts and norms only (no attention-sink or MTP tensors)",)

    def parse_layers(self) -> dict:
        n = self.num_layers()
        pattern = self.int_list("hybrid_layer_pattern", n)  # 1 = sliding window, 0 = full
        attn = self.mha()
        swa = SWASpec(num_key_value_heads=self.get_int("swa_num_key_value_heads", attn["num_key_value_heads"], 1),
                      head_dim=self.get_int("swa_head_dim", attn["head_dim"], 1),
                      v_head_dim=self.get_int("swa_v_head_dim", self.get_int("swa_head_dim", attn["v_head_dim"], 1), 1),
                      hybrid_pool=True)
        freq = self.cfg.get("moe_layer_freq")
        mlp = ["moe" if f else "dense" for f in freq] if isinstance(freq, list) and len(freq) == n else ["moe"] * n
        moe = MoESpec(num_experts=self.need_int("n_routed_experts"), top_k=self.need_int("num_experts_per_tok"),
                      intermediate_size=self.need_int("moe_intermediate_size"),
                      shared_intermediate_size=self.need_int("moe_intermediate_size") * self.get_int("n_shared_experts", 0),
                      score_bias=self.get("topk_method") == "noaux_tc")
        window = self.cfg.get("sliding_window") or self.need("sliding_window_size")
        return dict(**attn, layers=_window_layers([p == 1 for p in pattern], self.check_int(window, "sliding_window"),
                                                 mlp),
                    intermediate_size=self.need_int("intermediate_size"), moe=moe, swa=swa)


class Gemma3(Family):
    notes = ("Gemma 3: the sliding window is not used for sizing (SGLang 0.5.23 disables hybrid SWA memory for "
             "Gemma 2/3); the vision tower's weights are not counted",)
    # Gemma3TextConfig defaults for fields a checkpoint may leave out (transformers configuration_gemma3.py)
    DEFAULTS = {"vocab_size": 262208, "max_position_embeddings": 131072, "sliding_window_pattern": 6,
                "tie_word_embeddings": True}

    def __init__(self, cfg: dict, source: str, arch: str):
        super().__init__(cfg, source, arch)
        if arch == "Gemma3ForConditionalGeneration":
            self.prefix = "text_config."
            self.cfg = self.need("text_config", cfg, "text_config")
        self.cfg = {**self.DEFAULTS, **self.cfg}

    def parse_layers(self) -> dict:
        n = self.num_layers()
        types = self.cfg.get("layer_types")
        if types is None:  # Gemma3TextConfig: every sliding_window_pattern-th layer is global
            pattern = self.get_int("sliding_window_pattern", 6, minimum=1)
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
        elif not isinstance(types, list) or len(types) != n:
            raise ValueError(f"{self.source}: field '{self.prefix}layer_types' is not a list of {n} entries")
        attn = self.mha()
        attn["qk_norm"] = True  # Gemma3Attention's q_norm/k_norm
        h = self.need_int("hidden_size")
        # four norms per layer (input, post-attention, pre- and post-feedforward); the generic count has two
        extra = (WeightTensor("norms.pre_post_feedforward", h, 1, 2 * n),)
        windowed = [t == "sliding_attention" for t in types]
        return dict(**attn, layers=_window_layers(windowed, self.need_int("sliding_window"), ["dense"] * n),
                    intermediate_size=self.need_int("intermediate_size"), extra_weights=extra,
                    tie_word_embeddings=bool(self.cfg.get("tie_word_embeddings")),
                    # Gemma3TextScaledWordEmbedding is an nn.Embedding (gemma3_causal.py:532-566): every rank
                    # holds the whole table, which the tied LM head shares (:750)
                    embed_replicated=True,
                    swa=SWASpec(attn["num_key_value_heads"], attn["head_dim"], attn["v_head_dim"], hybrid_pool=False))
