"""Triton KDA decode step, in place on the SGLang state pool ``[slots, HV, V, K]`` (K contiguous; fp32 by default,
bf16/fp16 with ``--mamba-ssm-dtype``: the state is updated in fp32 and rounded on store).

Grid ``(N * HV, cdiv(V, BV))``: a program owns a ``[BV, K]`` tile of one request-head state (whole key
rows, so the gate, the L2 norms and ``S^T k`` need no cross-program reduction), reads it once and writes
it once. A slot < 0 (padding) writes a zero output and neither reads nor writes the state, as SGLang 0.5.23's
CUDA decode kernel does (``fused_recurrent_kda_packed_decode``, fla/fused_recurrent.py:458-463).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from poolsim.kernels._common import check, next_pow2
from poolsim.kernels.ops.kda_decode.naive import L2NORM_EPS, SOFTPLUS_THRESHOLD, check_slots, check_state_args

_EPS = tl.constexpr(L2NORM_EPS)
_THRESHOLD = tl.constexpr(SOFTPLUS_THRESHOLD)


@triton.jit
def _kda_decode_kernel(
    q, stride_qn, stride_qh, k, stride_kn, stride_kh, v, stride_vn, stride_vh,
    a, stride_an, b, stride_bn, A_log, dt_bias,
    state, stride_slot, slot_indices, o, stride_on, stride_oh, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
):
    i_nh = tl.program_id(0)
    i_v = tl.program_id(1)
    n = (i_nh // HV).to(tl.int64)
    hv = i_nh % HV
    h = hv // (HV // H)
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    mask_k = ok < K
    mask_v = ov < V
    slot = tl.load(slot_indices + n).to(tl.int64)
    if slot < 0:  # padding: a zero output, the state untouched
        tl.store(o + n * stride_on + hv * stride_oh + ov, tl.zeros([BV], dtype=tl.float32).to(o.dtype.element_ty),
                 mask=mask_v)
        return

    bq = tl.load(q + n * stride_qn + h * stride_qh + ok, mask=mask_k, other=0.0).to(tl.float32)
    bk = tl.load(k + n * stride_kn + h * stride_kh + ok, mask=mask_k, other=0.0).to(tl.float32)
    bq = bq / tl.sqrt(tl.sum(bq * bq) + _EPS) * scale
    bk = bk / tl.sqrt(tl.sum(bk * bk) + _EPS)
    bv = tl.load(v + n * stride_vn + hv * stride_vh + ov, mask=mask_v, other=0.0).to(tl.float32)

    x = tl.load(a + n * stride_an + hv * K + ok, mask=mask_k, other=0.0).to(tl.float32)
    x += tl.load(dt_bias + hv * K + ok, mask=mask_k, other=0.0).to(tl.float32)
    softplus = tl.where(x > _THRESHOLD, x, tl.log(1.0 + tl.exp(tl.minimum(x, _THRESHOLD))))
    decay = tl.exp(-tl.exp(tl.load(A_log + hv).to(tl.float32)) * softplus)  # [BK] = exp(g)
    beta = tl.sigmoid(tl.load(b + n * stride_bn + hv).to(tl.float32))

    p_s = state + slot * stride_slot + hv * (V * K) + ov[:, None] * K + ok[None, :]
    mask_s = mask_v[:, None] & mask_k[None, :]
    S = tl.load(p_s, mask=mask_s, other=0.0).to(tl.float32)  # [BV, BK]: rows v, columns k; fp32 math
    S = S * decay[None, :]
    u = beta * (bv - tl.sum(S * bk[None, :], 1))  # [BV]
    S = S + u[:, None] * bk[None, :]
    out = tl.sum(S * bq[None, :], 1)
    tl.store(o + n * stride_on + hv * stride_oh + ov, out.to(o.dtype.element_ty), mask=mask_v)
    tl.store(p_s, S.to(state.dtype.element_ty), mask=mask_s)


def default_config(kd: int, vd: int) -> tuple[int, int]:
    """(BV, num_warps): a ``[32, 128]`` fp32 tile per warp, as SGLang's decode kernel keeps."""
    bk = next_pow2(kd)
    bv = max(1, min(next_pow2(vd), 4096 // bk, 32))
    return bv, 1 if bk * bv <= 4096 else 4


def kda_decode_fwd(q, k, v, a, b, A_log, dt_bias, ssm_states, slot_indices, scale,
                   block_v: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    n, h, kd = q.shape
    hv, vd = v.shape[1], v.shape[2]
    check(ssm_states.dtype in (torch.float32, torch.bfloat16, torch.float16),
          f"ssm_states must be float32, bfloat16 or float16 (--mamba-ssm-dtype), got {ssm_states.dtype}")
    check(ssm_states.stride()[1:] == (vd * kd, kd, 1), "each ssm_states slot must be a contiguous [HV, V, K] block")
    for name, t in (("q", q), ("k", k), ("v", v), ("a", a), ("b", b)):
        check(t.stride(-1) == 1, f"{name}: last dimension must be contiguous")
    check(A_log.is_contiguous() and dt_bias.is_contiguous(), "A_log and dt_bias must be contiguous")
    default_bv, default_warps = default_config(kd, vd)
    bv = block_v or default_bv
    o = torch.empty(n, hv, vd, dtype=q.dtype, device=q.device)
    if n == 0:
        return o
    _kda_decode_kernel[(n * hv, triton.cdiv(vd, bv))](
        q, q.stride(0), q.stride(1), k, k.stride(0), k.stride(1), v, v.stride(0), v.stride(1),
        a, a.stride(0), b, b.stride(0), A_log, dt_bias,
        ssm_states, ssm_states.stride(0), slot_indices, o, o.stride(0), o.stride(1), scale,
        H=h, HV=hv, K=kd, V=vd, BK=next_pow2(kd), BV=bv,
        num_warps=num_warps or default_warps, num_stages=1,
    )
    return o


def kda_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
               A_log: torch.Tensor, dt_bias: torch.Tensor, ssm_states: torch.Tensor, slot_indices: torch.Tensor,
               scale: float | None = None) -> torch.Tensor:
    """One KDA decode step per request; updates ``ssm_states`` in place and returns o ``[N, HV, V]`` (q's dtype).

    q, k ``[N, H, K]`` (L2-normalised in the kernel; q scaled by ``scale``, default K^-1/2); v ``[N, HV, V]``;
    a ``[N, HV*K]`` raw gate, ``g = -exp(A_log[h]) * softplus(a + dt_bias[h, :])`` (threshold 20);
    b ``[N, HV]`` raw beta logits (``beta = sigmoid(b)``); A_log ``[HV]``; dt_bias ``[HV*K]``;
    ssm_states ``[slots, HV, V, K]`` fp32 (or bf16/fp16); slot_indices ``[N]``, a slot < 0 (padding) outputs zeros
    and its state is neither read nor written. HV may be a multiple of H (value head hv reads qk head ``hv // (HV // H)``).
    """
    n, _, kd, _, _ = check_state_args(q, k, v, a, b, A_log, dt_bias, ssm_states)
    check_slots(slot_indices, n, ssm_states.shape[0])
    return kda_decode_fwd(q, k, v, a, b, A_log, dt_bias, ssm_states, slot_indices,
                          kd ** -0.5 if scale is None else scale)
