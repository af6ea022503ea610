"""Dense GQA/MHA decoders: Llama, Mistral, Qwen2, Qwen3 (``models/llama.py``, ``qwen2.py``, ``qwen3.py``).

A Mistral-style uniform ``sliding_window`` (or Qwen's ``use_sliding_window`` from ``max_window_layers``
on) is off SGLang's hybrid-SWA allowlist: one ordinary pool, every layer sized as full.
"""

from __future__ import annotations

from poolsim.pools.model.config import LayerSpec, SWASpec
from poolsim.pools.model.families.base import Family


class DenseDecoder(Family):

    def parse_layers(self) -> dict:
        n = self.num_layers()
        attn = self.mha()
        windows = self.windows(n)
        fields = dict(**attn, layers=tuple(LayerSpec("attention", "dense", w) for w in windows),
                      intermediate_size=self.need_int("intermediate_size"))
        if any(windows):
            fields["swa"] = SWASpec(attn["num_key_value_heads"], attn["head_dim"], attn["v_head_dim"],
                                    hybrid_pool=False)
        return fields

    def windows(self, n: int) -> list[int]:
        window = self.cfg.get("sliding_window")
        if not window or window < 0:
            return [0] * n
        window = self.check_int(window, "sliding_window")
        if self.arch.startswith("Qwen"):  # Qwen2Config: windows only with use_sliding_window, from max_window_layers
            if not self.cfg.get("use_sliding_window"):
                return [0] * n
            first = self.get_int("max_window_layers", n)
            return [window if i >= first else 0 for i in range(n)]
        return [window] * n
