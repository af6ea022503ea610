"""Kimi-K3 (``models/kimi_k3.py``, ``kimi_k3_vl.py``, ``configs/kimi_k3.py``): the Kimi Linear backbone (KDA + MLA
layers, ``linear_attn_config`` lists 1-based) at frontier size, wrapped with a MoonViT3d vision tower.

What K3 changes against Kimi Linear, each read from ``text_config``:

- ``linear_attn_config.use_full_rank_gate``: the KDA output gate is a full-rank ``g_proj`` fused with q, k, v
  (``kimi_k3.py:1552-1600``); the recurrent state is Kimi Linear's (``configs/kimi_linear.py:172-182``).
- ``mla_use_output_gate``: the MLA layers gain a column-parallel ``g_proj`` (``:2271-2280``).
- ``attn_res_block_size``: every layer has two more RMSNorms and two 1-wide score projections, the model one
  more pair (``:2590-2607``, ``:2754-2767``); post_load caches their product in bf16 and float32 (``:3372-3381``).
- ``routed_expert_hidden_size``: the routed experts work in that latent between two replicated bf16
  projections, with an RMSNorm when ``latent_moe_use_norm`` (``:643-685``).
- ``quantization_config`` (compressed-tensors, ``mxfp4-pack-quantized``): only the routed experts are MXFP4
  (every other Linear is on the ignore list, and the latent projections get no quant config); how SGLang keeps
  them depends on the GPU (``config._expert_tensors``).
"""

from __future__ import annotations

from dataclasses import replace

from poolsim.pools.model.config import WeightTensor
from poolsim.pools.model.families.kimi_linear import KimiLinear
from poolsim.pools.model.families.vision import kimi_k3_vision_tensors, vit_size

# the compressed-tensors ignore patterns that leave only the routed experts quantized (the published K3 list)
_IGNORED = ("re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
            "re:.*lm_head.*")
PACKED_ARCHS = ("sm100",)  # model_overrides/kimi_k3.py:172-190: flashinfer_mxfp4 on SM100/103/107
FUSED_DECODE_TP = 8  # _prepare_fused_decode's kernel is compiled for 12 heads of 128 (kimi_k3.py:1978-2017)


class KimiK3(KimiLinear):

    def __init__(self, cfg: dict, source: str, arch: str):
        super().__init__(cfg, source, arch)
        self.cfg = self.need("text_config", cfg, "text_config")
        self.prefix = "text_config."

    def quantization(self) -> dict:
        q = self.cfg.get("quantization_config") or self.top.get("quantization_config")
        if not q:
            return {}
        where = f"{self.source}: field '{self.prefix}quantization_config"
        fmt = str(q.get("format", ""))
        if q.get("quant_method") != "compressed-tensors" or "mxfp4" not in fmt:
            raise ValueError(f"{where}' is {q.get('quant_method')!r} / {fmt!r}; poolsim sizes Kimi-K3 as bf16 or "
                             "as the compressed-tensors mxfp4-pack-quantized checkpoint")
        groups = q.get("config_groups") or {}
        weights = [g.get("weights") or {} for g in groups.values()]
        if len(weights) != 1 or (weights[0].get("num_bits"), weights[0].get("group_size"), weights[0].get("type")) != (
                4, 32, "float"):
            raise ValueError(f"{where}.config_groups' is not one 4-bit float group of 32 (MXFP4)")
        missing = [p for p in _IGNORED if p not in (q.get("ignore") or [])]
        if missing:
            raise ValueError(f"{where}.ignore' lacks {missing[0]!r}: layers beyond the routed experts would be "
                             "quantized, which poolsim does not size for Kimi-K3")
        return dict(quant_method="mxfp4")

    def parse_layers(self) -> dict:
        fields = super().parse_layers()
        lac = self.need("linear_attn_config")
        h, n = self.need_int("hidden_size"), self.num_layers()
        heads, v_dim = self.need_int("num_attention_heads"), self.need_int("v_head_dim")
        n_mla = len([layer for layer in fields["layers"] if layer.mixer == "attention"])
        la = replace(fields["linear_attn"], full_rank_gate=bool(lac.get("use_full_rank_gate", False)))
        moe = fields["moe"]
        latent = self.get_int("routed_expert_hidden_size", 0)
        if latent:
            moe = replace(moe, latent_size=latent, latent_norm=bool(self.get("latent_moe_use_norm", False)),
                          latent_quantized=False)
        if self.quantization():
            if latent and latent % 256:  # FusedMoE rounds the hidden to 256 for flashinfer_mxfp4 (layer.py:452-457)
                raise ValueError(f"{self.source}: field '{self.prefix}routed_expert_hidden_size' {latent} is not a "
                                 "multiple of 256; FusedMoE would pad it, which poolsim does not model")
            moe = replace(moe, mxfp4_packed_archs=PACKED_ARCHS)
        W = WeightTensor
        extra = []
        if self.get("mla_use_output_gate", False):
            extra.append(W("attn.g_proj", heads * v_dim, h, n_mla, "col"))
        if self.get("attn_res_block_size") is not None:
            extra += [W("attn_res.norms", 2 * h, 1, n), W("attn_res.proj", 2, h, n),
                      W("attn_res.output", 2 * h, 1),  # output_attn_res_norm + output_attn_res_proj
                      # get_cw caches norm * proj in bf16 and float32 per score projection (attn_residual.py:66-83)
                      W("attn_res.cw_cache", h, 1, 2 * n + 1, dtype_bytes=6, runtime_copy=True)]
        if la.full_rank_gate:
            # the fused KDA decode stash at tp 8: three [4, seg] fp32 conv slices, a zero fp32 conv bias and the
            # output norm in fp32 (kimi_k3.py:2001-2017)
            seg = la.num_heads // FUSED_DECODE_TP * la.head_dim
            per_layer = 3 * seg * 4 + 3 * seg + la.head_dim  # fp32 values
            extra.append(W("kda.fused_decode_stash", per_layer, 1, len(self.linear_layer_ids(fields)), "at_tp",
                           head_dim=FUSED_DECODE_TP, dtype_bytes=4, runtime_copy=True))
        vision = self.top.get("vision_config")
        if vision:
            extra += kimi_k3_vision_tensors(vision, h, self.source)
        # KimiK3VisionConfig aliases num_hidden_layers / hidden_size to the vt_* fields (configs/kimi_k3.py:72-76)
        return dict(fields, linear_attn=la, moe=moe, extra_weights=tuple(extra),
                    is_multimodal=True, multimodal_prefill_graph=True,  # configs/model_config.py:2512
                    vit_size=vit_size(vision, "vt_num_hidden_layers", "vt_hidden_size") if vision else None)

    @staticmethod
    def linear_layer_ids(fields: dict) -> list[int]:
        return [i for i, layer in enumerate(fields["layers"]) if layer.mixer == "kda"]
