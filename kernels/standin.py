"""The stand-in forward: one step of the model with random weights of its real per-rank shapes, over the live pools.

No checkpoint is read: every weight is seeded noise, so the numbers are meaningless but the work is the model's
(the same GEMM shapes, MoE top-k routing and grouped GEMM, attention through ``req_to_token``, KDA state updates).
Per layer: RMSNorm -> mixer -> residual -> RMSNorm -> MLP/MoE -> residual; then the final norm and the LM head on
each request's last token. Mixers:

- attention (MHA/GQA): QKV GEMM (per-head q/k RMSNorm where the model has it; Qwen3-Next's sigmoid output gate
  packed per head beside q), ``store_kv`` at the step's slots, ``extend_attention`` for prefill rows (prefix from
  the pool) and ``decode_attention`` for decode rows, output GEMM;
- attention (MLA, absorbed as SGLang's decode does): latent ``store_mla_kv``, q_nope absorbed into the latent,
  attention over ``kv_buffer`` with ``v = kv_buffer[..., :kv_lora_rank]``, value up-projection, output GEMM;
- KDA: QKV GEMM, ``conv1d_prefill`` / ``conv1d_update`` over the pool's conv state, ``kda_prefill`` /
  ``kda_decode`` over its recurrent state, gated RMSNorm, output GEMM;
- GDN (Qwen3-Next's gated delta net): the same conv and recurrent-state ops as KDA. GDN's gate is one scalar per
  value head, ``g = -exp(A_log[h]) * softplus(a[h] + dt_bias[h])``; KDA's is per head and key channel with the same
  formula, so the KDA ops run GDN exactly when ``a`` and ``dt_bias`` are repeated over the key channels
  (``gdn_gate_as_kda``). q/k have ``num_k_heads`` heads, v ``num_heads`` (the ops take HV a multiple of H);
- Mamba2 (Nemotron-H): in-projection to z, xBC and dt, ``conv1d_prefill`` / ``conv1d_update`` over xBC, the SSD
  state update (``mamba2_decode`` / chunked ``mamba2_prefill``: plain torch, the project has no Mamba2 kernel),
  gated grouped RMSNorm, output GEMM;
- short conv (LFM2): in-projection to B, C, x, ``conv1d_prefill`` / ``conv1d_update`` (no activation) over B*x and
  the pool's conv state, C times that, output GEMM (LFM2 has no recurrent state);
- none: Nemotron-H's MLP/MoE-only blocks (no mixer).
MLPs are SwiGLU (gate + up + down) or, where the model's are not gated (Nemotron-H), relu^2 (up + down). MoE
routers: softmax top-k, or for the routers with a score-correction bias (DeepSeek-V3, Kimi, Nemotron-H) SGLang's
sigmoid grouped top-k (``biased_grouped_topk``); Qwen3-Next's shared expert is scaled by its sigmoid gate. RoPE is
not stood in (elementwise, no pool traffic).

fp8 KV cache: the pools are uint8 (SGLang's ``store_dtype``); the ops get ``kv_dtype`` and unit scales
(``KV_SCALE``) and cast q themselves (q is never cast to the buffer dtype here).

``--layers`` runs a subset (``unit``: one layer of each (mixer, MLP) kind; N: up to N of each) and scales each
layer's measured time by how many layers of its kind the model has.

The forward is a list of segments (the embedding, each run layer's mixer and MLP, the head) so a decode step can
be replayed from CUDA graphs captured per segment (``kernels.replay.CudaGraphRunner``); the MoE segment sizes its
expert groups on the host and stays eager. Rows padded up to a graph bucket (``live`` 0) start from a zero
hidden state, so whatever they store (KV slot 0, as SGLang's padding does) is zero and the guard checks hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from poolsim import kernels
from poolsim.kernels.ops.kda_prefill import naive as kda_prefill_reference

SUPPORTED_MIXERS = ("attention", "kda", "gdn", "mamba2", "short_conv")
LINEAR_MIXERS = ("kda", "gdn", "mamba2", "short_conv")  # the ones with a state slot in the MambaPool
MAMBA2_CHUNK = 64  # tokens per chunk of the chunked SSD scan (prefill)
# The KV scale of a layer whose checkpoint has none (the stand-in's: it loads no checkpoint). SGLang 0.5.23: a model
# without a quantization config leaves ``k_scale``/``v_scale`` None (srt/layers/radix_attention.py:94-97), so the
# store does not scale (triton_backend.py:1662-1663) and decode descales by 1.0 (:2368-2373); an fp8 checkpoint
# without KV scales gets 1.0 for both (srt/layers/quantization/kv_cache.py:59-63). Either way: x / 1 and x * 1.
KV_SCALE = 1.0
FP8_KV_DTYPES = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}  # --kv-cache-dtype -> torch dtype


def kv_torch_dtype(kv_cache_dtype: str) -> torch.dtype | None:
    """The fp8 dtype the kernels view an fp8 KV pool's uint8 buffers as; None for a pool stored in its own dtype."""
    name = FP8_KV_DTYPES.get(kv_cache_dtype)
    return getattr(torch, name) if name else None


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
    lin_heads: int = 0  # linear attention: value heads (KDA: all heads; Mamba2: heads)
    lin_head_dim: int = 0  # value head dim (Mamba2: head_dim P)
    lin_k_heads: int = 0  # key heads (GDN: num_k_heads; Mamba2: n_groups; KDA: = lin_heads)
    lin_state: int = 0  # key head dim (GDN), state size N (Mamba2); KDA: = lin_head_dim
    conv_kernel: int = 4
    dense_inter: int = 0
    experts: int = 0
    top_k: int = 0
    moe_inter: int = 0
    shared_inter: int = 0
    expert_groups: int = 1  # grouped top-k routers (sigmoid + score bias): n_group / num_expert_group
    topk_groups: int = 1  # topk_group

    @staticmethod
    def of(model, tp: int) -> "Dims":
        moe, la = model.moe, model.linear_attn
        groups, topk_groups = expert_groups(model)
        conv = la is not None and la.kind == "short_conv"  # LFM2: one "head" of hidden / tp conv channels
        return Dims(
            expert_groups=groups, topk_groups=topk_groups,
            hidden=model.hidden_size, vocab=max(1, model.vocab_size // tp),
            heads=max(1, model.num_attention_heads // tp), kv_heads=max(1, model.num_key_value_heads // tp),
            head_dim=model.head_dim, v_head_dim=model.v_head_dim, kv_lora_rank=model.kv_lora_rank,
            qk_rope=model.qk_rope_head_dim, qk_nope=model.qk_nope_head_dim,
            lin_heads=max(1, la.num_heads // tp) if la else 0,
            lin_head_dim=(la.head_dim // tp if conv else la.head_dim) if la else 0,
            lin_k_heads=max(1, la.num_k_heads // tp) if la else 0, lin_state=la.head_k_dim if la else 0,
            conv_kernel=la.conv_kernel if la else 4,
            dense_inter=max(1, model.intermediate_size // tp) if model.intermediate_size else 0,
            experts=moe.num_experts if moe else 0, top_k=moe.top_k if moe else 0,
            moe_inter=max(1, moe.intermediate_size // tp) if moe else 0,
            shared_inter=max(1, moe.shared_intermediate_size // tp) if moe and moe.shared_intermediate_size else 0)

    @staticmethod
    def tiny(model) -> "Dims":
        """The model's structure at CI size: hidden 64, 4 query heads, 8 experts (top 2; at most 4 groups of 2 for a
        grouped router); linear attention: 2 value heads of 16 (GDN: on 1 key head of 16; Mamba2: 1 group, state 8;
        LFM2's short conv: 64 channels, as its conv width is the hidden size)."""
        moe, la = model.moe, model.linear_attn
        groups, topk_groups = expert_groups(model)
        groups = min(groups, 4)
        if la is not None and la.kind == "short_conv":
            la_dims = dict(lin_heads=1, lin_head_dim=64, lin_k_heads=1, lin_state=0)
        else:
            la_dims = dict(lin_heads=2 if la else 0, lin_head_dim=16 if la else 0,
                           lin_k_heads={"kda": 2, "gdn": 1, "mamba2": 1}.get(la.kind, 0) if la else 0,
                           lin_state={"kda": 16, "gdn": 16, "mamba2": 8}.get(la.kind, 0) if la else 0)
        return Dims(expert_groups=groups, topk_groups=min(topk_groups, groups), **la_dims, hidden=64, vocab=256,
                    heads=4, kv_heads=2 if model.num_key_value_heads < model.num_attention_heads else 4, head_dim=16,
                    v_head_dim=16, kv_lora_rank=32 if model.use_mla else 0, qk_rope=8 if model.use_mla else 0,
                    qk_nope=16 if model.use_mla else 0, conv_kernel=la.conv_kernel if la else 4,
                    dense_inter=128, experts=8 if moe else 0, top_k=min(2, moe.top_k) if moe else 0,
                    moe_inter=32 if moe else 0, shared_inter=32 if moe and moe.shared_intermediate_size else 0)

    @property
    def mla_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope

    def state_shape(self, kind: str):
        """The per-slot state shapes of these dims (tp 1: the dims are per rank already), as the pool lays them out."""
        from poolsim.pools.mem_cache.pool.mamba import MambaStateShape

        if kind == "kda":
            return MambaStateShape.kimi_linear(1, self.lin_heads, self.lin_head_dim, self.conv_kernel)
        if kind == "short_conv":  # Lfm2Config.mamba2_cache_params: conv only (state_size 0)
            return MambaStateShape.mamba2(1, intermediate_size=self.lin_head_dim, n_groups=1, num_heads=1,
                                          head_dim=self.lin_head_dim, state_size=0, conv_kernel=self.conv_kernel,
                                          kind=kind)
        return MambaStateShape.mamba2(1, intermediate_size=self.lin_heads * self.lin_head_dim,
                                      n_groups=self.lin_k_heads, num_heads=self.lin_heads, head_dim=self.lin_head_dim,
                                      state_size=self.lin_state, conv_kernel=self.conv_kernel, kind=kind)


def expert_groups(model) -> tuple[int, int]:
    """``(n_group, topk_group)`` of a grouped sigmoid router (the MoE has ``score_bias``), read from the HF config
    (DeepSeek/Nemotron-H: n_group; Kimi: num_expert_group); ``(1, 1)`` otherwise."""
    if model.moe is None or not model.moe.score_bias:
        return 1, 1
    cfg = model.hf_config.get("text_config", model.hf_config) if model.hf_config else {}
    groups = int(cfg.get("n_group") or cfg.get("num_expert_group") or 1)
    return groups, int(cfg.get("topk_group") or groups)


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


def gdn_gate_as_kda(a: torch.Tensor, dt_bias: torch.Tensor, k_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GDN's per-value-head gate inputs as KDA's per-channel ones: a ``[T, HV]`` -> ``[T, HV*K]``, dt_bias ``[HV]``
    -> ``[HV*K]``. KDA's gate ``-exp(A_log[h]) * softplus(a[h, k] + dt_bias[h, k])`` is then GDN's on every k."""
    return a.repeat_interleave(k_dim, dim=-1).contiguous(), dt_bias.repeat_interleave(k_dim).contiguous()


def _mamba2_inputs(B, C, dt, A_log, dt_bias, heads):
    """fp32 B, C per head (``[T, H, N]``, group h // (H / G)), dt = softplus(dt + dt_bias) and A = -exp(A_log)."""
    group = heads // B.shape[1]
    return (B.float().repeat_interleave(group, dim=1), C.float().repeat_interleave(group, dim=1),
            F.softplus(dt.float() + dt_bias.float()), -torch.exp(A_log.float()))


def mamba2_decode(x, B, C, dt, A_log, dt_bias, D, ssm_states, slot_indices):
    """One Mamba2 SSD step per request (torch; the project has no Mamba2 kernel). x ``[N, H, P]``, B, C
    ``[N, G, S]``, dt ``[N, H]``; ssm_states, the pool's ``[slots, H, P, S]``, updated in place:
    ``s <- exp(dt A) s + dt x B^T``, ``y = s C + D x``. A slot of -1 is a padding row: zero output, its state
    untouched. No host sync (a CUDA graph can capture it): a padding row reads slot 0 and writes it back unchanged."""
    n, h, _ = x.shape
    Bh, Ch, dt, A = _mamba2_inputs(B, C, dt, A_log, dt_bias, h)
    live = slot_indices >= 0
    idx = slot_indices.clamp(min=0).long()
    old = ssm_states[idx]
    xf = x.float()
    S = old.float() * live[:, None, None, None]
    S = S * torch.exp(dt * A)[..., None, None] + (dt[..., None] * xf)[..., None] * Bh[:, :, None, :]
    y = torch.einsum("nhps,nhs->nhp", S, Ch) + D.float()[:, None] * xf
    ssm_states[idx] = torch.where(live[:, None, None, None], S.to(ssm_states.dtype), old)
    return (y * live[:, None, None]).to(x.dtype)


def mamba2_prefill(x, B, C, dt, A_log, dt_bias, D, ssm_states, slot_indices, cu_seqlens, has_initial_state=None,
                   chunk: int = MAMBA2_CHUNK):
    """The SSD recurrence of ``mamba2_decode`` over variable-length sequences (``cu_seqlens``), chunked: within a
    chunk the quadratic form ``y_i = sum_{j<=i} exp(c_i - c_j) dt_j (C_i . B_j) x_j + exp(c_i) C_i s0 + D x_i`` with
    ``c`` the cumulative ``dt A``, then the state carried to the next chunk. Sequence i starts from its slot's state
    where ``has_initial_state[i]``, else from zero, and leaves its final state there; slot -1: zero output."""
    total, h, p = x.shape
    Bh, Ch, dt, A = _mamba2_inputs(B, C, dt, A_log, dt_bias, h)
    xf = x.float()
    y = torch.zeros(total, h, p, dtype=torch.float32, device=x.device)
    cu, slots = cu_seqlens.tolist(), slot_indices.tolist()
    init = [True] * len(slots) if has_initial_state is None else [bool(v) for v in has_initial_state.tolist()]
    for i, slot in enumerate(slots):
        if slot < 0:
            continue
        S = ssm_states[slot].float() if init[i] else torch.zeros(ssm_states.shape[1:], device=x.device)
        for a in range(cu[i], cu[i + 1], chunk):
            b = min(a + chunk, cu[i + 1])
            xs, bs, cs, d = xf[a:b], Bh[a:b], Ch[a:b], dt[a:b]
            cum = torch.cumsum(d * A, dim=0)  # [L, H]
            n = b - a
            causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()[..., None]
            decay = torch.exp((cum[:, None] - cum[None]).masked_fill(~causal, float("-inf")))  # [i, j, H]
            w = decay * torch.einsum("ihs,jhs->ijh", cs, bs) * d[None]
            y[a:b] = (torch.einsum("ijh,jhp->ihp", w, xs) + torch.exp(cum)[..., None]
                      * torch.einsum("hps,ihs->ihp", S, cs) + D.float()[:, None] * xs)
            S = S * torch.exp(cum[-1])[:, None, None] + torch.einsum(
                "jh,jhp,jhs->hps", torch.exp(cum[-1][None] - cum) * d, xs, bs)
        ssm_states[slot] = S.to(ssm_states.dtype)
    return y.to(x.dtype)


def biased_grouped_topk(logits, bias, top_k: int, groups: int, topk_groups: int, renormalize: bool = True,
                        scaling: float = 1.0):
    """The sigmoid router with a score-correction bias (DeepSeek-V3, Kimi, Nemotron-H; SGLang's
    ``biased_grouped_topk_impl``, srt/layers/moe/topk.py:1780-1856): scores ``sigmoid(logits)``; experts chosen by
    ``scores + bias`` among the ``topk_groups`` groups whose two best biased scores sum highest; weights the unbiased
    scores of the chosen, renormalized to sum 1 (+1e-20) and times ``routed_scaling_factor`` (applied on the output
    by the MoE runner or in top-k: the same product). Returns ``(weights fp32 [T, k], ids [T, k])``."""
    scores = logits.float().sigmoid()
    t, e = scores.shape
    choice = scores + bias.float()
    group_scores = choice.view(t, groups, e // groups).topk(min(2, e // groups), dim=-1)[0].sum(-1)
    keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(topk_groups, dim=-1)[1], 1.0)
    keep = keep.bool()[:, :, None].expand(t, groups, e // groups).reshape(t, e)
    ids = choice.masked_fill(~keep, float("-inf")).topk(top_k, dim=-1)[1]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * scaling, ids


Segment = tuple  # (timer label, graph-safe, fn(x) -> x)
# Bytes of fp32 attention scores one query block of the reference prefill attention may hold. The reference
# materialises a request's ``[Hq, extend, prefix + extend]`` scores at once (a 32k-token prompt on 4 heads: 16 GiB);
# in query blocks its peak is bounded (the Triton kernel tiles on its own and is left whole).
SCORE_BLOCK_BYTES = 64 << 20


def query_blocks(rows: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor, heads: int,
                 max_bytes: int = SCORE_BLOCK_BYTES) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prefill requests split into query blocks, as requests of their own: block ``[a, b)`` of request i's new
    tokens is the request (row i, prefix ``p + a``, extend ``b - a``). Every new token's keys are already in the
    pool (``store_kv`` ran first) and reached through the same ``req_to_token`` row, so each query row attends to
    exactly the keys it did (its prefix and, causally, the tokens before it): the same output (to fp32 rounding:
    SDPA may sum a one-row block in another order), blocks contiguous in q's order. A block holds at most
    ``max_bytes`` of fp32 scores (at least one query row)."""
    out_rows, out_prefix, out_extend = [], [], []
    for r, p, e in zip(rows.tolist(), prefix_lens.tolist(), extend_lens.tolist()):
        block = max(1, max_bytes // (4 * heads * max(1, p + e)))
        for a in range(0, e, block):
            out_rows.append(r)
            out_prefix.append(p + a)
            out_extend.append(min(block, e - a))
    as_t = lambda xs: torch.tensor(xs, dtype=torch.int64, device=rows.device)  # noqa: E731
    return as_t(out_rows), as_t(out_prefix), as_t(out_extend)


class StandInForward:
    """Random weights for the run layers; ``forward(inputs, timer)`` runs one step over the pools it is given."""

    def __init__(self, model, dims: Dims, layer_ids: list[int], device: str, dtype: torch.dtype, seed: int = 0,
                 kv_pool=None, mamba_pool=None, req_to_token=None, kv_dtype: torch.dtype | None = None):
        """``kv_dtype``: the fp8 dtype of an fp8 KV pool (its buffers are uint8, SGLang's ``store_dtype``), else None.
        The stand-in has no checkpoint, hence no KV scales: an fp8 pool gets SGLang's unit ``KV_SCALE``."""
        self.model, self.d, self.layer_ids = model, dims, list(layer_ids)
        self.kv_dtype = kv_dtype
        self.kv_scale = KV_SCALE if kv_dtype is not None else None
        self.device, self.dtype = torch.device(device), dtype
        self.kv_pool, self.mamba_pool, self.req_to_token = kv_pool, mamba_pool, req_to_token
        self.attn_index = {lid: i for i, lid in enumerate(l for l in self.layer_ids
                                                          if model.layers[l].mixer == "attention")}
        self.lin_index = {lid: i for i, lid in enumerate(l for l in self.layer_ids
                                                         if model.layers[l].mixer in LINEAR_MIXERS)}
        self.moe_gated = model.moe.gated if model.moe else True
        cfg = model.hf_config.get("text_config", model.hf_config) if model.hf_config else {}
        renorm = cfg.get("norm_topk_prob", cfg.get("moe_renormalize", True))
        self.router_norm = (bool(renorm), float(cfg.get("routed_scaling_factor") or 1.0))  # biased_grouped_topk
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

    def _f32(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device)  # fp32 parameters (conv weights, A_log, dt_bias, D), as the models keep them

    def _ones(self, n: int) -> torch.Tensor:
        return torch.ones(n, dtype=self.dtype, device=self.device)

    def _layer(self, spec) -> dict:
        d, w = self.d, {}
        w["norm1"], w["norm2"] = self._ones(d.hidden), self._ones(d.hidden)
        if spec.mixer == "attention" and self.model.use_mla:
            w["wq"] = self._w(d.hidden, d.heads * (d.qk_nope + d.qk_rope))
            w["wkv_a"] = self._w(d.hidden, d.mla_dim)
            w["w_kc"] = self._w(d.heads, d.qk_nope, d.kv_lora_rank)
            w["w_vc"] = self._w(d.heads, d.kv_lora_rank, d.v_head_dim)
            w["wo"] = self._w(d.heads * d.v_head_dim, d.hidden)
        elif spec.mixer == "attention":  # Qwen3-Next packs a sigmoid output gate per head beside q
            gate = 2 if self.model.attn_output_gate else 1
            w["wqkv"] = self._w(d.hidden, (gate * d.heads + d.kv_heads) * d.head_dim + d.kv_heads * d.v_head_dim)
            w["wo"] = self._w(d.heads * d.v_head_dim, d.hidden)
            if self.model.qk_norm:  # per-head RMSNorm on q and k (Qwen3, Qwen3-Next, LFM2)
                w["q_norm"], w["k_norm"] = self._ones(d.head_dim), self._ones(d.head_dim)
        elif spec.mixer == "short_conv":  # LFM2: in_proj to B, C, x; conv over B*x; out_proj of C * conv
            hd = d.lin_head_dim
            w["in_proj"] = self._w(d.hidden, 3 * hd)
            w["conv"] = self._w(hd, d.conv_kernel, scale=0.5)  # model dtype: a plain nn.Parameter in Lfm2ShortConv
            w["wo"] = self._w(hd, d.hidden)
        elif spec.mixer == "kda":
            hd = d.lin_heads * d.lin_head_dim
            w["wqkv"] = self._w(d.hidden, 3 * hd)
            w["conv"] = self._f32(torch.randn(3 * hd, d.conv_kernel, generator=self.gen) * 0.5)
            w["wfa"] = self._w(d.hidden, d.lin_head_dim)
            w["wfb"] = self._w(d.lin_head_dim, hd)
            w["wb"] = self._w(d.hidden, d.lin_heads)
            w["wg"] = self._w(d.hidden, hd)
            w["A_log"] = self._f32(torch.log(torch.rand(d.lin_heads, generator=self.gen) * 15 + 1))
            w["dt_bias"] = self._f32(torch.rand(hd, generator=self.gen) - 0.5)
            w["onorm"] = self._ones(d.lin_head_dim)
            w["wo"] = self._w(hd, d.hidden)
        elif spec.mixer == "gdn":  # Qwen3-Next: in_proj_qkvz, in_proj_ba, conv over q k v, gated RMSNorm
            kd, vd = d.lin_k_heads * d.lin_state, d.lin_heads * d.lin_head_dim
            w["wqkvz"] = self._w(d.hidden, 2 * kd + 2 * vd)
            w["wba"] = self._w(d.hidden, 2 * d.lin_heads)
            w["conv"] = self._f32(torch.randn(2 * kd + vd, d.conv_kernel, generator=self.gen) * 0.5)
            w["A_log"] = self._f32(torch.log(torch.rand(d.lin_heads, generator=self.gen) * 15 + 1))
            w["dt_bias"] = self._f32(torch.rand(d.lin_heads, generator=self.gen) - 0.5)
            w["onorm"] = self._ones(d.lin_head_dim)
            w["wo"] = self._w(vd, d.hidden)
        elif spec.mixer == "mamba2":  # Nemotron-H: in_proj to z, xBC, dt; conv over xBC; gated grouped RMSNorm
            hp, gs = d.lin_heads * d.lin_head_dim, d.lin_k_heads * d.lin_state
            w["in_proj"] = self._w(d.hidden, 2 * hp + 2 * gs + d.lin_heads)
            w["conv"] = self._f32(torch.randn(hp + 2 * gs, d.conv_kernel, generator=self.gen) * 0.5)
            w["A_log"] = self._f32(torch.log(torch.rand(d.lin_heads, generator=self.gen) * 15 + 1))
            w["dt_bias"] = self._f32(torch.rand(d.lin_heads, generator=self.gen) - 0.5)
            w["D"] = self._f32(torch.ones(d.lin_heads))
            w["onorm"] = self._ones(hp // d.lin_k_heads)
            w["wo"] = self._w(hp, d.hidden)
        gated_dense = getattr(self.model, "dense_mlp_gated", True)
        if spec.mlp == "dense":
            w["w_gu"] = self._w(d.hidden, (2 if gated_dense else 1) * d.dense_inter)
            w["w_d"] = self._w(d.dense_inter, d.hidden)
            w["gated"] = gated_dense
        elif spec.mlp == "moe":
            up = (2 if self.moe_gated else 1)
            w["router"] = self._w(d.hidden, d.experts)
            if self.model.moe.score_bias:  # e_score_correction_bias, an fp32 parameter
                w["score_bias"] = self._f32(torch.randn(d.experts, generator=self.gen) * 0.1)
            w["e_gu"] = self._w(d.experts, d.hidden, up * d.moe_inter)
            w["e_d"] = self._w(d.experts, d.moe_inter, d.hidden)
            if d.shared_inter:
                w["s_gu"] = self._w(d.hidden, up * d.shared_inter)
                w["s_d"] = self._w(d.shared_inter, d.hidden)
                if self.model.moe.shared_expert_gate:  # Qwen3-Next: sigmoid(h @ gate) scales the shared expert
                    w["s_gate"] = self._w(d.hidden, 1)
        return w

    # ---------------------------------------------------------------- forward
    def token_ids(self, num_tokens: int, step_seed: int) -> torch.Tensor:
        g = torch.Generator(device="cpu").manual_seed(step_seed)
        return torch.randint(0, self.d.vocab, (num_tokens,), generator=g).to(self.device)

    def segments(self, inp: StepInputs, ids: torch.Tensor, live: torch.Tensor | None = None) -> list[Segment]:
        """The step as ``(label, graph_safe, fn)`` in order, ``fn(x) -> x``: the embedding (``live`` 0 zeroes a
        padding row), each run layer's norm + mixer + residual and norm + MLP + residual (both labelled with the
        layer id), the final norm and LM head (returns the logits). MoE is not graph-safe: it sizes its expert
        groups on the host."""
        segs = [("embed", True, lambda _x: self.embed[ids] * (1 if live is None else live[:, None].to(self.dtype)))]
        for lid in self.layer_ids:
            spec, w = self.model.layers[lid], self.layers[lid]
            if spec.mixer != "none":
                segs.append((lid, True, lambda x, spec=spec, w=w, lid=lid: x + self._mixer(spec, w, rms_norm(
                    x, w["norm1"]), inp, lid)))
            if spec.mlp != "none":
                segs.append((lid, spec.mlp != "moe", lambda x, spec=spec, w=w: x + (
                    self._moe(rms_norm(x, w["norm2"]), w) if spec.mlp == "moe"
                    else self._mlp(rms_norm(x, w["norm2"]), w["w_gu"], w["w_d"], w["gated"]))))
        segs.append(("head", True, lambda x: self._head(x, inp)))
        return segs

    def forward(self, inp: StepInputs, timer, step_seed: int = 0, live: torch.Tensor | None = None) -> torch.Tensor:
        """One step, eager; ``timer.mark(label)`` after each segment. Returns the logits."""
        x = None
        for label, _, fn in self.segments(inp, self.token_ids(inp.num_tokens, step_seed), live):
            x = fn(x)
            timer.mark(label)
        return x

    def _head(self, x, inp):
        ne = inp.extend_lens.numel()
        last = torch.cat([torch.cumsum(inp.extend_lens, 0) - 1,
                          inp.num_ext_tokens + torch.arange(inp.dec_rows.numel(), device=self.device)]) \
            if ne else torch.arange(inp.num_tokens, device=self.device)
        logits = rms_norm(x[last], self.final_norm) @ self.lm_head
        logits.argmax(-1)  # sampling stands in as a greedy pick
        return logits

    def _mixer(self, spec, w, h, inp, lid):
        if spec.mixer == "attention":
            return self._mla(h, w, inp, lid) if self.model.use_mla else self._mha(h, w, inp, lid)
        return {"kda": self._kda, "gdn": self._gdn, "mamba2": self._mamba2,
                "short_conv": self._short_conv}[spec.mixer](h, w, inp, lid)

    @staticmethod
    def _mlp(h, w_gu, w_d, gated=True):
        if gated:  # SwiGLU
            gate, up = (h @ w_gu).chunk(2, dim=-1)
            return (F.silu(gate) * up) @ w_d
        return torch.relu(h @ w_gu).square() @ w_d  # relu^2 (Nemotron-H)

    def _moe(self, h, w):
        d = self.d
        logits = (h @ w["router"]).float()  # seeded inputs and weights: a seeded routing
        if "score_bias" in w:
            weights, topi = biased_grouped_topk(logits, w["score_bias"], d.top_k, d.expert_groups, d.topk_groups,
                                                *self.router_norm)
            weights = weights.to(h.dtype)
        else:
            topv, topi = logits.topk(d.top_k, dim=-1)
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
                y = self._mlp(h[rows], w["e_gu"][e], w["e_d"][e], self.moe_gated) * weights.flatten()[idx, None]
                out.index_add_(0, rows, y)
                start += n
        if "s_gu" in w:
            shared = self._mlp(h, w["s_gu"], w["s_d"], self.moe_gated)
            out = out + (shared * torch.sigmoid(h @ w["s_gate"]) if "s_gate" in w else shared)
        return out

    def _attend(self, q, k_buf, v_buf, inp: StepInputs, sm_scale):
        """Prefill rows through ``extend_attention``, decode rows through ``decode_attention``. q stays in the model
        dtype: the ops cast it to the cache's as SGLang does (an fp8 cache: rounded only where SGLang rounds it)."""
        ne = inp.num_ext_tokens
        parts = []
        if ne:
            rows, prefix, extend = inp.ext_rows, inp.prefix_lens, inp.extend_lens
            if kernels.implementation("extend_attention", q) == "naive":  # it holds a block's scores: bound them
                rows, prefix, extend = query_blocks(rows, prefix, extend, q.shape[1], SCORE_BLOCK_BYTES)
            parts.append(kernels.extend_attention(q[:ne], k_buf, v_buf, self.req_to_token, rows, prefix, extend,
                                                  sm_scale, kv_dtype=self.kv_dtype))
        if inp.dec_rows.numel():
            parts.append(kernels.decode_attention(q[ne:], k_buf, v_buf, self.req_to_token, inp.dec_rows,
                                                  inp.dec_seq_lens, sm_scale, k_scale=self.kv_scale,
                                                  v_scale=self.kv_scale, kv_dtype=self.kv_dtype))
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def _mha(self, h, w, inp, lid):
        d = self.d
        t = h.shape[0]
        qkv = h @ w["wqkv"]
        gated = self.model.attn_output_gate
        q, k, v = qkv.split([(2 if gated else 1) * d.heads * d.head_dim, d.kv_heads * d.head_dim,
                             d.kv_heads * d.v_head_dim], dim=-1)
        q = q.reshape(t, d.heads, -1)
        if gated:  # per head [q | gate] (Qwen3NextAttention.forward_prepare_native)
            q, gate = q.chunk(2, dim=-1)
        k = k.reshape(t, d.kv_heads, d.head_dim)
        if "q_norm" in w:
            q, k = rms_norm(q, w["q_norm"]), rms_norm(k, w["k_norm"])
        pool = self.kv_pool
        li = self.attn_index[lid]
        k_buf, v_buf = pool.k_buffer[li], pool.v_buffer[li]
        loc = torch.cat([inp.ext_loc, inp.dec_loc])
        kernels.store_kv(k_buf, v_buf, loc, k.contiguous(),
                         v.reshape(t, d.kv_heads, d.v_head_dim).contiguous(), self.kv_scale, self.kv_scale,
                         self.kv_dtype)
        o = self._attend(q.contiguous(), k_buf, v_buf, inp, None)
        if gated:
            o = o * torch.sigmoid(gate)
        return o.reshape(t, -1) @ w["wo"]

    def _mla(self, h, w, inp, lid):
        d = self.d
        t = h.shape[0]
        q = (h @ w["wq"]).reshape(t, d.heads, d.qk_nope + d.qk_rope)
        latent = (h @ w["wkv_a"]).reshape(t, 1, d.mla_dim)
        kv_buf = self.kv_pool.kv_buffer[self.attn_index[lid]]
        if self.kv_scale is not None:  # the MLA pool takes no scale: the backend divides first (triton_backend.py:2326)
            latent = latent / self.kv_scale
        kernels.store_mla_kv(kv_buf, torch.cat([inp.ext_loc, inp.dec_loc]), latent.contiguous(),
                             kv_dtype=self.kv_dtype)
        q_lat = torch.einsum("thn,hnl->thl", q[..., :d.qk_nope], w["w_kc"])
        qq = torch.cat([q_lat, q[..., d.qk_nope:]], dim=-1)
        o = self._attend(qq, kv_buf, kv_buf[..., :d.kv_lora_rank], inp, (d.qk_nope + d.qk_rope) ** -0.5)
        o = torch.einsum("thl,hlv->thv", o, w["w_vc"])
        return o.reshape(t, -1) @ w["wo"]

    # ---------------------------------------------------------------- linear attention
    def _cu(self, inp):
        return torch.cat([torch.zeros(1, dtype=torch.int64, device=self.device), torch.cumsum(inp.extend_lens, 0)])

    def _conv(self, mixed, w, inp, conv_state, activation="silu"):
        """The causal conv over the prefill rows (``conv1d_prefill``) and the decode rows (``conv1d_update``)."""
        ne, outs = inp.num_ext_tokens, []
        if ne:
            outs.append(kernels.conv1d_prefill(mixed[:ne], conv_state, w["conv"], None, inp.ext_slots, self._cu(inp),
                                               inp.prefix_lens > 0, activation))
        if mixed.shape[0] > ne:
            outs.append(kernels.conv1d_update(mixed[ne:], conv_state, w["conv"], None, inp.dec_slots, activation))
        return torch.cat(outs) if len(outs) > 1 else outs[0]

    def _delta_rule(self, q, k, v, a, b, A_log, dt_bias, inp, ssm):
        """KDA's (and, with the gate repeated over the key channels, GDN's) gated delta rule over the state pool."""
        ne, outs = inp.num_ext_tokens, []
        if ne:
            # fla's chunk_kda on a GPU; on the CPU the torch reference even when the Triton ops are forced
            prefill = kernels.kda_prefill if q.is_cuda else kda_prefill_reference.kda_prefill
            outs.append(prefill(q[:ne], k[:ne], v[:ne], a[:ne], b[:ne], A_log, dt_bias, ssm, inp.ext_slots,
                                self._cu(inp), inp.prefix_lens > 0))
        if q.shape[0] > ne:
            outs.append(kernels.kda_decode(q[ne:], k[ne:], v[ne:], a[ne:], b[ne:], A_log, dt_bias, ssm,
                                           inp.dec_slots))
        return torch.cat(outs) if len(outs) > 1 else outs[0]

    def _kda(self, h, w, inp, lid):
        d = self.d
        t, hd = h.shape[0], d.lin_heads * d.lin_head_dim
        li = self.lin_index[lid]
        conv_state = self.mamba_pool.conv[0][li].transpose(-1, -2)  # [slots, dim, W-1], the kernels' view
        y = self._conv(h @ w["wqkv"], w, inp, conv_state)
        q, k, v = (z.reshape(t, d.lin_heads, d.lin_head_dim).contiguous() for z in y.chunk(3, dim=-1))
        a = ((h @ w["wfa"]) @ w["wfb"]).contiguous()
        o = self._delta_rule(q, k, v, a, (h @ w["wb"]).contiguous(), w["A_log"], w["dt_bias"], inp,
                             self.mamba_pool.temporal[li])
        o = rms_norm(o, w["onorm"]) * torch.sigmoid(h @ w["wg"]).reshape(t, d.lin_heads, d.lin_head_dim)
        return o.reshape(t, hd).to(h.dtype) @ w["wo"]

    def _gdn(self, h, w, inp, lid):
        d = self.d
        t, kd, vd = h.shape[0], d.lin_k_heads * d.lin_state, d.lin_heads * d.lin_head_dim
        li = self.lin_index[lid]
        qkv, z = (h @ w["wqkvz"]).split([2 * kd + vd, vd], dim=-1)
        b, a = (h @ w["wba"]).chunk(2, dim=-1)
        y = self._conv(qkv.contiguous(), w, inp, self.mamba_pool.conv[0][li])  # the pool's [slots, dim, W-1]
        q, k, v = y.split([kd, kd, vd], dim=-1)
        q = q.reshape(t, d.lin_k_heads, d.lin_state).contiguous()
        k = k.reshape(t, d.lin_k_heads, d.lin_state).contiguous()
        v = v.reshape(t, d.lin_heads, d.lin_head_dim).contiguous()
        a_k, dt_bias_k = gdn_gate_as_kda(a, w["dt_bias"], d.lin_state)
        o = self._delta_rule(q, k, v, a_k, b.contiguous(), w["A_log"], dt_bias_k, inp, self.mamba_pool.temporal[li])
        o = rms_norm(o, w["onorm"]) * F.silu(z).reshape(t, d.lin_heads, d.lin_head_dim)  # RMSNormGated
        return o.reshape(t, vd).to(h.dtype) @ w["wo"]

    def _mamba2(self, h, w, inp, lid):
        d = self.d
        t, hp, gs, ne = h.shape[0], d.lin_heads * d.lin_head_dim, d.lin_k_heads * d.lin_state, inp.num_ext_tokens
        li = self.lin_index[lid]
        z, xbc, dt = (h @ w["in_proj"]).split([hp, hp + 2 * gs, d.lin_heads], dim=-1)
        y = self._conv(xbc.contiguous(), w, inp, self.mamba_pool.conv[0][li])
        x, B, C = y.split([hp, gs, gs], dim=-1)
        x = x.reshape(t, d.lin_heads, d.lin_head_dim)
        B, C = B.reshape(t, d.lin_k_heads, d.lin_state), C.reshape(t, d.lin_k_heads, d.lin_state)
        ssm, args = self.mamba_pool.temporal[li], (w["A_log"], w["dt_bias"], w["D"])
        outs = []
        if ne:
            outs.append(mamba2_prefill(x[:ne], B[:ne], C[:ne], dt[:ne], *args, ssm, inp.ext_slots, self._cu(inp),
                                       inp.prefix_lens > 0))
        if t > ne:
            outs.append(mamba2_decode(x[ne:], B[ne:], C[ne:], dt[ne:], *args, ssm, inp.dec_slots))
        o = (torch.cat(outs) if len(outs) > 1 else outs[0]).reshape(t, hp)
        # MixerRMSNormGated: y * silu(z), then RMSNorm within each of the n_groups groups
        o = rms_norm((o * F.silu(z)).reshape(t, d.lin_k_heads, hp // d.lin_k_heads), w["onorm"]).reshape(t, hp)
        return o.to(h.dtype) @ w["wo"]

    def _short_conv(self, h, w, inp, lid):
        """LFM2's gated short conv (Lfm2ShortConv.forward): ``out_proj(C * conv(B * x))``, the conv without an
        activation over the pool's conv state (``conv1d_prefill`` / ``conv1d_update``); no recurrent state."""
        li = self.lin_index[lid]
        b, c, x = (h @ w["in_proj"]).chunk(3, dim=-1)
        y = self._conv((b * x).contiguous(), w, inp, self.mamba_pool.conv[0][li], activation=None)
        return (c * y) @ w["wo"]
