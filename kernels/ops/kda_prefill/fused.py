"""GPU ``kda_prefill``: fla-core's ``chunk_kda`` (pinned in pyproject's ``gpu`` extra) on pool slots.

fla takes one initial state per sequence, so the states are gathered from the pool (zeros for padding
slots and for sequences without a cached prefix), run with ``state_v_first=True`` (the pool's
``[HV, V, K]`` layout) and the final states are scattered back. fla is imported on first call only.
"""

from __future__ import annotations

import torch

from poolsim.kernels._common import check, check_cu_seqlens
from poolsim.kernels.ops.kda_decode.naive import check_slots, check_state_args


def kda_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                A_log: torch.Tensor, dt_bias: torch.Tensor, ssm_states: torch.Tensor, slot_indices: torch.Tensor,
                cu_seqlens: torch.Tensor, has_initial_state: torch.Tensor | None = None, scale: float | None = None,
                chunk_size: int = 64) -> torch.Tensor:
    """KDA over packed sequences ``cu_seqlens``, starting from and writing back to ``ssm_states[slot_indices]``.

    q, k ``[T, H, K]``; v ``[T, HV, V]``; a ``[T, HV*K]`` raw gate; b ``[T, HV]`` raw beta logits; A_log ``[HV]``;
    dt_bias ``[HV*K]``; ssm_states ``[slots, HV, V, K]`` fp32; slot_indices ``[N]`` (slot < 0: zero start, not
    stored); cu_seqlens ``[N+1]``; has_initial_state ``[N]`` bool or None (None: every sequence resumes its
    slot; False: starts from zeros, as for a request without a cached prefix). Returns o ``[T, HV, V]``.
    """
    from fla.ops.kda import chunk_kda

    total, _, kd, hv, _ = check_state_args(q, k, v, a, b, A_log, dt_bias, ssm_states)
    check_cu_seqlens(cu_seqlens, total)
    n = cu_seqlens.numel() - 1
    check_slots(slot_indices, n, ssm_states.shape[0])
    check(ssm_states.dtype == torch.float32, "ssm_states must be float32 (fla's chunk_kda requires it)")
    live = slot_indices >= 0
    if has_initial_state is not None:
        check(tuple(has_initial_state.shape) == (n,), "has_initial_state must be [N]")
        resume = live & has_initial_state.to(live.device, torch.bool)
    else:
        resume = live
    safe = torch.where(live, slot_indices, torch.zeros_like(slot_indices)).long()
    h0 = torch.where(resume[:, None, None, None], ssm_states[safe], 0.0)  # [N, HV, V, K]
    o, ht = chunk_kda(
        q=q.unsqueeze(0), k=k.unsqueeze(0), v=v.unsqueeze(0), g=a.reshape(1, total, hv, kd), beta=b.unsqueeze(0),
        scale=kd ** -0.5 if scale is None else scale, initial_state=h0, output_final_state=True,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
        state_v_first=True, cu_seqlens=cu_seqlens.long(), A_log=A_log, dt_bias=dt_bias, chunk_size=chunk_size,
    )
    ssm_states[slot_indices[live].long()] = ht[live].to(ssm_states.dtype)
    return o[0].to(q.dtype)
