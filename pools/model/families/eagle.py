"""EAGLE draft heads for Llama-like targets (``models/llama_eagle3.py``, ``models/llama_eagle.py``).

A draft of ``--speculative-algorithm EAGLE3`` is ``LlamaForCausalLMEagle3``: ``num_hidden_layers`` Llama decoder
layers (usually one) whose first layer takes ``2 x hidden`` (the token embedding next to the target's hidden
state) into its qkv projection and adds a ``hidden_norm``; an ``fc`` (a plain ``torch.nn.Linear``, replicated)
folds ``num_aux_hidden_states`` (default 3) target hidden states of ``target_hidden_size`` into one; its own
``embed_tokens`` over the full vocabulary; an ``lm_head`` over ``draft_vocab_size`` tokens (the full vocabulary
when the config has none). An EAGLE (EAGLE-2) draft, ``LlamaForCausalLMEagle``, has an ``fc`` of ``2 x hidden``.
The KV pool of the draft worker has its own geometry: the draft's heads and head dim over its layers.

The weights counted here are what the draft worker allocates when it is built, before the target's KV pool is
sized (managers/scheduler.py:1077-1108); its embedding (and, with the full vocabulary, its head) are replaced by
the target's only afterwards (speculative/eagle_worker_v2.py:243-258, :336-378).
"""

from __future__ import annotations

from poolsim.pools.model.config import LayerSpec, WeightTensor
from poolsim.pools.model.families.base import Family

EAGLE3_NUM_AUX_HIDDEN_STATES = 3  # llama_eagle3.py:152-161: num_aux_hidden_states, else eagle_config's ids, else 3


class LlamaEagle(Family):

    def parse_layers(self) -> dict:
        n = self.num_layers()
        attn = self.mha()
        attn["attention_bias"] = False
        h = self.need_int("hidden_size")
        heads, kv, hd = self.need_int("num_attention_heads"), attn["num_key_value_heads"], attn["head_dim"]
        vocab = self.need_int("vocab_size")
        W = WeightTensor
        extra = []
        eagle3 = self.arch == "LlamaForCausalLMEagle3"
        if eagle3:
            aux = self.cfg.get("num_aux_hidden_states")
            if aux is None:
                ids = (self.cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
                aux = len(ids) if ids else EAGLE3_NUM_AUX_HIDDEN_STATES
            target_h = self.get_int("target_hidden_size", h, minimum=1)
            draft_vocab = self.get_int("draft_vocab_size", vocab, minimum=1)
            # the first layer's qkv reads 2 x hidden: the half the generic list lacks, and its hidden_norm
            extra += [W("eagle3.q_proj_hidden_input", heads * hd, h, 1, "col"),
                      W("eagle3.k_proj_hidden_input", kv * hd, h, 1, "kv_heads", head_dim=hd),
                      W("eagle3.v_proj_hidden_input", kv * hd, h, 1, "kv_heads", head_dim=hd),
                      W("eagle3.hidden_norm", h, 1),
                      W("eagle3.fc", h, target_h * int(aux), 1),
                      W("lm_head", draft_vocab, h, shard="vocab")]
        else:
            extra += [W("eagle.fc", h, 2 * h, 1), W("lm_head", vocab, h, shard="vocab")]
        return dict(**attn, layers=tuple(LayerSpec("attention", "dense") for _ in range(n)),
                    intermediate_size=self.need_int("intermediate_size"), extra_weights=tuple(extra),
                    tie_word_embeddings=True)  # the lm_head is in extra_weights (its own vocabulary)
