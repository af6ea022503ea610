"""Torch references for ``kda_prefill``: chunked (chunk 64, the algorithm fla's ``chunk_kda`` runs) and recurrent.

Chunked form, per sequence, head and chunk of length C, with G the in-chunk cumulative sum of g
(../shared/KDA.md section 4):
``Akk[r, c] = beta_r sum_d k_rd k_cd exp(G_rd - G_cd)`` (c < r), ``Aqk[r, c] = sum_d q_rd k_cd exp(G_rd - G_cd)``
(c <= r); ``T = (I + Akk)^-1 diag(beta)``; ``W = T (k * exp(G))``, ``U = T v``; then with the state S entering
the chunk: ``V' = U - W S``, ``O = (q * exp(G)) S + Aqk V'``, ``S <- diag(exp(G_C)) S + (k * exp(G_C - G))^T V'``.
Every exponent is <= 0 (G falls within a chunk and only c <= r pairs are kept), so nothing overflows.
"""

from __future__ import annotations

import torch

from poolsim.kernels._common import check, check_cu_seqlens
from poolsim.kernels.ops.kda_decode.naive import (
    check_slots,
    check_state_args,
    compute_dtype,
    gather_states,
    kda_gate,
    kda_step,
    prepare_qk,
    scatter_states,
)


def _prepare(q, k, v, a, b, A_log, dt_bias, ssm_states, slot_indices, cu_seqlens, has_initial_state, scale):
    total, _, kd, hv, _ = check_state_args(q, k, v, a, b, A_log, dt_bias, ssm_states)
    check_cu_seqlens(cu_seqlens, total)
    n = cu_seqlens.numel() - 1
    check_slots(slot_indices, n, ssm_states.shape[0])
    check(has_initial_state is None or tuple(has_initial_state.shape) == (n,), "has_initial_state must be [N]")
    dt = compute_dtype(q, ssm_states)
    scale = kd ** -0.5 if scale is None else scale
    qh, kh = prepare_qk(q, k, hv, scale, dt)
    g = kda_gate(a, A_log, dt_bias, dt)
    beta = torch.sigmoid(b.to(dt))
    S = gather_states(ssm_states, slot_indices, dt)  # [N, HV, K, V]
    if has_initial_state is not None:
        S[~has_initial_state.to(S.device, torch.bool)] = 0
    return qh, kh, v.to(dt), g, beta, S, cu_seqlens.tolist()


def kda_prefill_recurrent(q, k, v, a, b, A_log, dt_bias, ssm_states, slot_indices, cu_seqlens,
                          has_initial_state=None, scale=None):
    """Token by token, the decode step in a loop: the simplest statement of the recurrence."""
    qh, kh, vv, g, beta, S, cu = _prepare(q, k, v, a, b, A_log, dt_bias, ssm_states, slot_indices, cu_seqlens,
                                          has_initial_state, scale)
    o = torch.zeros(vv.shape, dtype=vv.dtype, device=vv.device)
    for i in range(len(cu) - 1):
        s = S[i]  # [HV, K, V]
        for t in range(cu[i], cu[i + 1]):
            s, o[t] = kda_step(s, qh[t], kh[t], vv[t], g[t], beta[t])
        S[i] = s
    scatter_states(ssm_states, slot_indices, S)
    return o.to(q.dtype)


def chunk_forward(S, q, k, v, g, beta):
    """One chunk for all heads: S ``[HV, K, V]``; q, k, g ``[C, HV, K]``; v ``[C, HV, V]``; beta ``[C, HV]``."""
    q, k, g, v = (x.transpose(0, 1) for x in (q, k, g, v))  # [HV, C, .]
    beta = beta.transpose(0, 1)  # [HV, C]
    c = q.shape[1]
    G = g.cumsum(1)  # [HV, C, K]
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    diff = G[:, :, None, :] - G[:, None, :, :]  # [HV, r, c, K]
    decay = torch.exp(diff.masked_fill(~causal[None, :, :, None], float("-inf")))
    Aqk = torch.einsum("hrd,hcd,hrcd->hrc", q, k, decay)
    Akk = torch.einsum("hrd,hcd,hrcd->hrc", k, k, decay).tril(-1) * beta[:, :, None]
    eye = torch.eye(c, dtype=q.dtype, device=q.device)
    T = torch.linalg.solve_triangular(eye + Akk, torch.diag_embed(beta), upper=False, unitriangular=True)
    W = T @ (k * torch.exp(G))
    U = T @ v
    V_new = U - W @ S  # [HV, C, V]
    O = (q * torch.exp(G)) @ S + Aqk @ V_new
    G_last = G[:, -1:, :]  # [HV, 1, K]
    S = torch.exp(G_last).transpose(1, 2) * S + (k * torch.exp(G_last - G)).transpose(1, 2) @ V_new
    return S, O.transpose(0, 1)


def kda_prefill(q, k, v, a, b, A_log, dt_bias, ssm_states, slot_indices, cu_seqlens, has_initial_state=None,
                scale=None, chunk_size=64):
    qh, kh, vv, g, beta, S, cu = _prepare(q, k, v, a, b, A_log, dt_bias, ssm_states, slot_indices, cu_seqlens,
                                          has_initial_state, scale)
    o = torch.zeros(vv.shape, dtype=vv.dtype, device=vv.device)
    for i in range(len(cu) - 1):
        s = S[i]
        for t0 in range(cu[i], cu[i + 1], chunk_size):
            t1 = min(t0 + chunk_size, cu[i + 1])
            s, o[t0:t1] = chunk_forward(s, qh[t0:t1], kh[t0:t1], vv[t0:t1], g[t0:t1], beta[t0:t1])
        S[i] = s
    scatter_states(ssm_states, slot_indices, S)
    return o.to(q.dtype)
