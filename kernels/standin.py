"""The stand-in forward: one step of the model with random weights of its real per-rank shapes, over the live pools.

No checkpoint is read: every weight is seeded noise, so the numbers are meaningless but the work is the model's
(the same GEMM shapes, MoE top-k routing and grouped GEMM, attention through ``req_to_token``, KDA state updates).
Per layer: RMSNorm -> mixer -> residual -> RMSNorm -> MLP/MoE -> residual; then the final norm and the LM head on
each request's last token. Mixers:

- attention (MHA/GQA): QKV GEMM, ``store_kv`` at the step's slots, ``extend_attention`` for prefill rows
  (prefix from the pool) and ``decode_attention`` for decode rows, output GEMM;
- attention (MLA, absorbed as SGLang's decode does): latent ``store_mla_kv``, q_nope absorbed into the latent,
  attention over ``kv_buffer`` with ``v = kv_buffer[..., :kv_lora_rank]``, value up-projection, output GEMM;
- KDA: QKV GEMM, ``conv1d_prefill`` / ``conv1d_update`` over the pool's conv state, ``kda_prefill`` /
  ``kda_decode`` over its recurrent state, gated RMSNorm, output GEMM.

``--layers`` runs a subset (``unit``: one layer of each (mixer, MLP) kind; N: up to N of each) and scales each
layer's measured time by how many layers of its kind the model has. GDN/Mamba2 mixers are not stood in (yet).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import kernels
from kernels.ops.kda_prefill import naive as kda_prefill_reference

SUPPORTED_MIXERS = ("attention", "kda")


@dataclass(frozen=True)
class Dims:
    """Per-rank shapes the stand-in allocates (``of``: the model's real ones; ``tiny``: a few of everything)."""

    hidden: int
    vocab: int
    heads: int  # query heads (MHA and MLA)
    kv_heads: int
    head_dim: int  # MHA q/k head dim
    v_head_dim: int
    kv_lora_rank: int = 0  # MLA
    qk_rope: int = 0
    qk_nope: int = 0
    lin_heads: int = 0  # KDA
    lin_head_dim: int = 0
    conv_kernel: int = 4
    dense_inter: int = 0
    experts: int = 0
    top_k: int = 0
    moe_inter: int = 0
    shared_inter: int = 0

    @staticmethod
    def of(model, tp: int) -> "Dims":
        moe, la = model.moe, model.linear_attn
        return Dims(
            hidden=model.hidden_size, vocab=max(1, model.vocab_size // tp),
            heads=max(1, model.num_attention_heads // tp), kv_heads=max(1, model.num_key_value_heads // tp),
            head_dim=model.head_dim, v_head_dim=model.v_head_dim, kv_lora_rank=model.kv_lora_rank,
            qk_rope=model.qk_rope_head_dim, qk_nope=model.qk_nope_head_dim,
            lin_heads=max(1, la.num_heads // tp) if la else 0, lin_head_dim=la.head_dim if la else 0,
            conv_kernel=la.conv_kernel if la else 4,
            dense_inter=max(1, model.intermediate_size // tp) if model.intermediate_size else 0,
            experts=moe.num_experts if moe else 0, top_k=moe.top_k if moe else 0,
            moe_inter=max(1, moe.intermediate_size // tp) if moe else 0,
            shared_inter=max(1, moe.shared_intermediate_size // tp) if moe and moe.shared_intermediate_size else 0)

    @staticmethod
    def tiny(model) -> "Dims":
        """The model's structure at CI size: hidden 64, 4 query heads, 8 experts (top 2), 2 KDA heads of 16."""
        moe, la = model.moe, model.linear_attn
        return Dims(hidden=64, vocab=256, heads=4, kv_heads=2 if model.num_key_value_heads < model.num_attention_heads
                    else 4, head_dim=16, v_head_dim=16, kv_lora_rank=32 if model.use_mla else 0,
                    qk_rope=8 if model.use_mla else 0, qk_nope=16 if model.use_mla else 0,
                    lin_heads=2 if la else 0, lin_head_dim=16 if la else 0, conv_kernel=la.conv_kernel if la else 4,
                    dense_inter=128, experts=8 if moe else 0, top_k=min(2, moe.top_k) if moe else 0,
                    moe_inter=32 if moe else 0, shared_inter=32 if moe and moe.shared_intermediate_size else 0)

    @property
    def mla_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope


def select_layers(model, spec: str) -> tuple[list[int], dict[int, float]]:
    """Layer ids to run and, per run layer, how many model layers it stands for (``full`` | ``unit`` | N)."""
    kinds: dict[tuple[str, str], list[int]] = {}
    for i, layer in enumerate(model.layers):
        if layer.mixer not in SUPPORTED_MIXERS + ("none",):
            raise ValueError(f"--model {model.name}: the stand-in forward has no {layer.mixer} mixer "
                             f"(supported: {', '.join(SUPPORTED_MIXERS)})")
        kinds.setdefault((layer.mixer, layer.mlp), []).append(i)
    if spec == "full":
        per_kind = None
    elif spec == "unit":
        per_kind = 1
    else:
        try:
            per_kind = int(spec)
        except ValueError:
            per_kind = 0
        if per_kind < 1:
            raise ValueError(f"--layers {spec!r}: expected full, unit or a positive number of layers per kind")
    run, scale = [], {}
    for ids in kinds.values():
        chosen = ids if per_kind is None else ids[:per_kind]
        for i in chosen:
            scale[i] = len(ids) / len(chosen)
        run.extend(chosen)
    return sorted(run), scale


@dataclass
class StepInputs:
    """One step's rows and slots, read from the live pools (prefill rows first, then decode rows)."""

    ext_rows: torch.Tensor  # [Ne] request rows
    prefix_lens: torch.Tensor  # [Ne]
    extend_lens: torch.Tensor  # [Ne]
    ext_loc: torch.Tensor  # [sum extend] KV slots of the new prefill tokens
    dec_rows: torch.Tensor  # [Nd]
    dec_seq_lens: torch.Tensor  # [Nd] (the new token included)
    dec_loc: torch.Tensor  # [Nd] the new token's KV slot
    ext_slots: torch.Tensor | None  # [Ne] mamba state slots (hybrids)
    dec_slots: torch.Tensor | None

    @property
    def num_ext_tokens(self) -> int:
        return int(self.ext_loc.numel())

    @property
    def num_tokens(self) -> int:
        return self.num_ext_tokens + int(self.dec_rows.numel())


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


class StandInForward:
    """Random weights for the run layers; ``forward(inputs, timer)`` runs one step over the pools it is given."""

    def __init__(self, model, dims: Dims, layer_ids: list[int], device: str, dtype: torch.dtype, seed: int = 0,
                 kv_pool=None, mamba_pool=None, req_to_token=None):
        self.model, self.d, self.layer_ids = model, dims, list(layer_ids)
        self.device, self.dtype = torch.device(device), dtype
        self.kv_pool, self.mamba_pool, self.req_to_token = kv_pool, mamba_pool, req_to_token
        self.attn_index = {lid: i for i, lid in enumerate(l for l in self.layer_ids
                                                          if model.layers[l].mixer == "attention")}
        self.lin_index = {lid: i for i, lid in enumerate(l for l in self.layer_ids if model.layers[l].mixer == "kda")}
        self.gen = torch.Generator(device="cpu").manual_seed(seed)
        d = dims
        self.embed = self._w(d.vocab, d.hidden, scale=1.0)
        self.lm_head = self._w(d.hidden, d.vocab)
        self.final_norm = torch.ones(d.hidden, dtype=dtype, device=self.device)
        self.layers = {lid: self._layer(model.layers[lid]) for lid in self.layer_ids}

    # ---------------------------------------------------------------- weights
    def _w(self, *shape, scale: float | None = None) -> torch.Tensor:
        fan_in = shape[-2] if len(shape) >= 2 else shape[-1]
        s = (1.0 / math.sqrt(fan_in)) if scale is None else scale
        return (torch.randn(*shape, generator=self.gen) * s).to(self.device, self.dtype)

    def _layer(self, spec) -> dict:
        d, w = self.d, {}
        w["norm1"] = torch.ones(d.hidden, dtype=self.dtype, device=self.device)
        w["norm2"] = torch.ones(d.hidden, dtype=self.dtype, device=self.device)
        if spec.mixer == "attention" and self.model.use_mla:
            w["wq"] = self._w(d.hidden, d.heads * (d.qk_nope + d.qk_rope))
            w["wkv_a"] = self._w(d.hidden, d.mla_dim)
            w["w_kc"] = self._w(d.heads, d.qk_nope, d.kv_lora_rank)
            w["w_vc"] = self._w(d.heads, d.kv_lora_rank, d.v_head_dim)
            w["wo"] = self._w(d.heads * d.v_head_dim, d.hidden)
        elif spec.mixer == "attention":
            w["wqkv"] = self._w(d.hidden, (d.heads + d.kv_heads) * d.head_dim + d.kv_heads * d.v_head_dim)
            w["wo"] = self._w(d.heads * d.v_head_dim, d.hidden)
        elif spec.mixer == "kda":
            hd = d.lin_heads * d.lin_head_dim
            w["wqkv"] = self._w(d.hidden, 3 * hd)
            w["conv"] = (torch.randn(3 * hd, d.conv_kernel, generator=self.gen) * 0.5).to(self.device)  # fp32
            w["wfa"] = self._w(d.hidden, d.lin_head_dim)
            w["wfb"] = self._w(d.lin_head_dim, hd)
            w["wb"] = self._w(d.hidden, d.lin_heads)
            w["wg"] = self._w(d.hidden, hd)
            w["A_log"] = torch.log(torch.rand(d.lin_heads, generator=self.gen) * 15 + 1).to(self.device)
            w["dt_bias"] = (torch.rand(hd, generator=self.gen) - 0.5).to(self.device)
            w["onorm"] = torch.ones(d.lin_head_dim, dtype=self.dtype, device=self.device)
            w["wo"] = self._w(hd, d.hidden)
        if spec.mlp == "dense":
            w["w_gu"] = self._w(d.hidden, 2 * d.dense_inter)
            w["w_d"] = self._w(d.dense_inter, d.hidden)
        elif spec.mlp == "moe":
            w["router"] = self._w(d.hidden, d.experts)
            w["e_gu"] = self._w(d.experts, d.hidden, 2 * d.moe_inter)
            w["e_d"] = self._w(d.experts, d.moe_inter, d.hidden)
            if d.shared_inter:
                w["s_gu"] = self._w(d.hidden, 2 * d.shared_inter)
                w["s_d"] = self._w(d.shared_inter, d.hidden)
        return w

    # ---------------------------------------------------------------- forward
    def forward(self, inp: StepInputs, timer, step_seed: int = 0) -> torch.Tensor:
        """One step; ``timer.mark(label)`` after the embedding, each layer and the head. Returns the logits."""
        g = torch.Generator(device="cpu").manual_seed(step_seed)
        ids = torch.randint(0, self.d.vocab, (inp.num_tokens,), generator=g).to(self.device)
        x = self.embed[ids]
        timer.mark("embed")
        for lid in self.layer_ids:
            spec, w = self.model.layers[lid], self.layers[lid]
            h = rms_norm(x, w["norm1"])
            if spec.mixer == "attention":
                x = x + (self._mla(h, w, inp, lid) if self.model.use_mla else self._mha(h, w, inp, lid))
            elif spec.mixer == "kda":
                x = x + self._kda(h, w, inp, lid)
            if spec.mlp != "none":
                h = rms_norm(x, w["norm2"])
                x = x + (self._moe(h, w) if spec.mlp == "moe" else self._mlp(h, w["w_gu"], w["w_d"]))
            timer.mark(lid)
        ne = inp.extend_lens.numel()
        last = torch.cat([torch.cumsum(inp.extend_lens, 0) - 1,
                          inp.num_ext_tokens + torch.arange(inp.dec_rows.numel(), device=self.device)]) \
            if ne else torch.arange(inp.num_tokens, device=self.device)
        logits = rms_norm(x[last], self.final_norm) @ self.lm_head
        logits.argmax(-1)  # sampling stands in as a greedy pick
        timer.mark("head")
        return logits

    @staticmethod
    def _mlp(h, w_gu, w_d):
        gate, up = (h @ w_gu).chunk(2, dim=-1)
        return (F.silu(gate) * up) @ w_d

    def _moe(self, h, w):
        d = self.d
        scores = (h @ w["router"]).float()
        topv, topi = scores.topk(d.top_k, dim=-1)  # seeded inputs and weights: a seeded routing
        weights = torch.softmax(topv, dim=-1).to(h.dtype)
        flat = topi.flatten()
        order = flat.argsort()
        counts = torch.bincount(flat, minlength=d.experts).tolist()
        token = order // d.top_k
        out = torch.zeros_like(h)
        start = 0
        for e, n in enumerate(counts):  # grouped GEMM: each expert over the tokens routed to it
            if n:
                idx = order[start:start + n]
                rows = token[start:start + n]
                y = self._mlp(h[rows], w["e_gu"][e], w["e_d"][e]) * weights.flatten()[idx, None]
                out.index_add_(0, rows, y)
                start += n
        if "s_gu" in w:
            out = out + self._mlp(h, w["s_gu"], w["s_d"])
        return out

    def _attend(self, q, k_buf, v_buf, inp: StepInputs, sm_scale):
        ne = inp.num_ext_tokens
        parts = []
        if ne:
            parts.append(kernels.extend_attention(q[:ne], k_buf, v_buf, self.req_to_token, inp.ext_rows,
                                                  inp.prefix_lens, inp.extend_lens, sm_scale))
        if inp.dec_rows.numel():
            parts.append(kernels.decode_attention(q[ne:].to(k_buf.dtype), k_buf, v_buf, self.req_to_token,
                                                  inp.dec_rows, inp.dec_seq_lens, sm_scale).to(q.dtype))
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def _mha(self, h, w, inp, lid):
        d = self.d
        t = h.shape[0]
        qkv = h @ w["wqkv"]
        q, k, v = qkv.split([d.heads * d.head_dim, d.kv_heads * d.head_dim, d.kv_heads * d.v_head_dim], dim=-1)
        q = q.reshape(t, d.heads, d.head_dim)
        pool = self.kv_pool
        li = self.attn_index[lid]
        k_buf, v_buf = pool.k_buffer[li], pool.v_buffer[li]
        loc = torch.cat([inp.ext_loc, inp.dec_loc])
        kernels.store_kv(k_buf, v_buf, loc, k.reshape(t, d.kv_heads, d.head_dim).contiguous(),
                         v.reshape(t, d.kv_heads, d.v_head_dim).contiguous())
        o = self._attend(q.to(k_buf.dtype), k_buf, v_buf, inp, None).to(h.dtype)
        return o.reshape(t, -1) @ w["wo"]

    def _mla(self, h, w, inp, lid):
        d = self.d
        t = h.shape[0]
        q = (h @ w["wq"]).reshape(t, d.heads, d.qk_nope + d.qk_rope)
        latent = (h @ w["wkv_a"]).reshape(t, 1, d.mla_dim)
        kv_buf = self.kv_pool.kv_buffer[self.attn_index[lid]]
        kernels.store_mla_kv(kv_buf, torch.cat([inp.ext_loc, inp.dec_loc]), latent.contiguous())
        q_lat = torch.einsum("thn,hnl->thl", q[..., :d.qk_nope], w["w_kc"])
        qq = torch.cat([q_lat, q[..., d.qk_nope:]], dim=-1).to(kv_buf.dtype)
        o = self._attend(qq, kv_buf, kv_buf[..., :d.kv_lora_rank], inp, (d.qk_nope + d.qk_rope) ** -0.5)
        o = torch.einsum("thl,hlv->thv", o.to(h.dtype), w["w_vc"])
        return o.reshape(t, -1) @ w["wo"]

    def _kda(self, h, w, inp, lid):
        d = self.d
        t, hd, ne = h.shape[0], d.lin_heads * d.lin_head_dim, inp.num_ext_tokens
        li = self.lin_index[lid]
        conv_state = self.mamba_pool.conv[0][li].transpose(-1, -2)  # [slots, dim, W-1], the kernels' view
        ssm = self.mamba_pool.temporal[li]  # [slots, HV, V, K]
        mixed = h @ w["wqkv"]
        a = (h @ w["wfa"]) @ w["wfb"]
        b = h @ w["wb"]
        outs = []
        if ne:
            cu = torch.cat([torch.zeros(1, dtype=torch.int64, device=self.device), torch.cumsum(inp.extend_lens, 0)])
            has_init = inp.prefix_lens > 0
            y = kernels.conv1d_prefill(mixed[:ne], conv_state, w["conv"], None, inp.ext_slots, cu, has_init)
            q, k, v = (z.reshape(ne, d.lin_heads, d.lin_head_dim).contiguous() for z in y.chunk(3, dim=-1))
            # fla's chunk_kda on a GPU; on the CPU the torch reference even when the Triton ops are forced
            prefill = kernels.kda_prefill if q.is_cuda else kda_prefill_reference.kda_prefill
            outs.append(prefill(q, k, v, a[:ne].contiguous(), b[:ne].contiguous(), w["A_log"], w["dt_bias"], ssm,
                                inp.ext_slots, cu, has_init))
        if t > ne:
            y = kernels.conv1d_update(mixed[ne:], conv_state, w["conv"], None, inp.dec_slots)
            q, k, v = (z.reshape(t - ne, d.lin_heads, d.lin_head_dim).contiguous() for z in y.chunk(3, dim=-1))
            outs.append(kernels.kda_decode(q, k, v, a[ne:].contiguous(), b[ne:].contiguous(), w["A_log"],
                                           w["dt_bias"], ssm, inp.dec_slots))
        o = torch.cat(outs) if len(outs) > 1 else outs[0]
        o = rms_norm(o, w["onorm"]) * torch.sigmoid(h @ w["wg"]).reshape(t, d.lin_heads, d.lin_head_dim)
        return o.reshape(t, hd).to(h.dtype) @ w["wo"]
