"""Torch reference for ``kda_decode``, and the KDA pieces the prefill references share.

A step, per request and value head, on the state S ``[K, V]`` (the pool stores its transpose ``[V, K]``):
``S <- diag(exp(g)) S; u = beta (v - S^T k); S <- S + k u^T; o = S^T q`` (../shared/KDA.md section 1).
A slot < 0 (padding) outputs zeros and its state is neither read nor written (SGLang 0.5.23's CUDA decode,
``fused_recurrent_kda_packed_decode``); ``kda_prefill`` runs such a sequence from a zero state and stores nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from poolsim.kernels._common import capturing, check, check_index_range, check_shape

L2NORM_EPS = 1e-6
SOFTPLUS_THRESHOLD = 20.0


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """fp64 when any input is fp64 (hand-checked tests), else fp32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def kda_gate(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``g = -exp(A_log[h]) * softplus(a + dt_bias[h, :])``: a ``[..., HV*K]`` -> g ``[..., HV, K]``."""
    hv = A_log.numel()
    x = a.to(dtype).unflatten(-1, (hv, -1)) + dt_bias.to(dtype).view(hv, -1)
    return -torch.exp(A_log.to(dtype)).view(hv, 1) * F.softplus(x, beta=1.0, threshold=SOFTPLUS_THRESHOLD)


def prepare_qk(q: torch.Tensor, k: torch.Tensor, hv: int, scale: float, dtype: torch.dtype):
    """L2-normalise q and k ``[..., H, K]``, scale q, and give each of the HV value heads its qk head."""
    group = hv // q.shape[-2]
    qh = (l2norm(q.to(dtype)) * scale).repeat_interleave(group, dim=-2)
    kh = l2norm(k.to(dtype)).repeat_interleave(group, dim=-2)
    return qh, kh


def kda_step(S: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
             beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """S ``[..., K, V]``; q, k, g ``[..., K]`` (q, k prepared); v ``[..., V]``; beta ``[...]`` -> (S', o ``[..., V]``)."""
    S = S * torch.exp(g)[..., None]
    u = beta[..., None] * (v - torch.einsum("...kv,...k->...v", S, k))
    S = S + k[..., None] * u[..., None, :]
    return S, torch.einsum("...kv,...k->...v", S, q)


def check_state_args(q, k, v, a, b, A_log, dt_bias, ssm_states):
    check(q.dim() == 3 and k.shape == q.shape, "q, k must be [tokens, H, K] and alike")
    t, h, kd = q.shape
    check(v.dim() == 3 and v.shape[0] == t, "v must be [tokens, HV, V]")
    hv, vd = v.shape[1], v.shape[2]
    check(hv % h == 0, f"HV {hv} must be a multiple of H {h}")
    check_shape("a", a, (t, hv * kd))
    check_shape("b", b, (t, hv))
    check_shape("A_log", A_log, (hv,))
    check_shape("dt_bias", dt_bias, (hv * kd,))
    check(ssm_states.dim() == 4 and tuple(ssm_states.shape[1:]) == (hv, vd, kd),
          f"ssm_states must be [slots, HV={hv}, V={vd}, K={kd}], got {tuple(ssm_states.shape)}")
    check(ssm_states.is_floating_point(), "ssm_states must be a float tensor")
    return t, h, kd, hv, vd


def check_slots(slot_indices: torch.Tensor, n: int, num_slots: int) -> None:
    check(slot_indices.dim() == 1 and slot_indices.numel() == n and not slot_indices.is_floating_point(),
          f"slot_indices must be an integer [{n}]")
    check_index_range("slot_indices", slot_indices, num_slots, allow_negative=True)
    if n and not capturing():
        live = slot_indices[slot_indices >= 0]
        check(live.unique().numel() == live.numel(), "slot_indices repeats a slot: the in-place updates would race")


def gather_states(ssm_states: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Pool ``[slots, HV, V, K]`` -> states ``[N, HV, K, V]``; zeros where slot < 0."""
    n = slots.numel()
    _, hv, vd, kd = ssm_states.shape
    S = torch.zeros(n, hv, kd, vd, dtype=dtype, device=ssm_states.device)
    live = slots >= 0
    S[live] = ssm_states[slots[live].long()].to(dtype).transpose(-1, -2)
    return S


def scatter_states(ssm_states: torch.Tensor, slots: torch.Tensor, S: torch.Tensor) -> None:
    live = slots >= 0
    ssm_states[slots[live].long()] = S[live].transpose(-1, -2).to(ssm_states.dtype)


def kda_decode(q, k, v, a, b, A_log, dt_bias, ssm_states, slot_indices, scale=None):
    n, _, kd, hv, _ = check_state_args(q, k, v, a, b, A_log, dt_bias, ssm_states)
    check_slots(slot_indices, n, ssm_states.shape[0])
    dt = compute_dtype(q, ssm_states)
    scale = kd ** -0.5 if scale is None else scale
    qh, kh = prepare_qk(q, k, hv, scale, dt)
    g = kda_gate(a, A_log, dt_bias, dt)
    beta = torch.sigmoid(b.to(dt))
    S = gather_states(ssm_states, slot_indices, dt)
    S, o = kda_step(S, qh, kh, v.to(dt), g, beta)
    scatter_states(ssm_states, slot_indices, S)
    # a padded request (slot < 0) outputs zeros, as SGLang's CUDA decode kernel writes them
    # (fused_recurrent_kda_packed_decode, fla/fused_recurrent.py:458-463)
    o[slot_indices < 0] = 0
    return o.to(q.dtype)
