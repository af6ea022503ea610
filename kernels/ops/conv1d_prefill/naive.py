"""Torch reference for ``conv1d_prefill``: the varlen form of ``conv1d_update``.

Sequence i is ``x[cu[i]:cu[i+1]]``; its window starts from the slot's state (or zeros where
``has_initial_state`` is False); ``y[t] = act(sum_j weight[:, j] * window[t + j] + bias)``; the slot keeps the last
W-1 inputs (the state a following decode step reads). Equal to ``conv1d_update`` run token by token (the test
checks this). A slot < 0 (padding) skips its sequence: no state is read or written, as SGLang 0.5.23's
``causal_conv1d_fn`` returns early for ``pad_slot_id`` (mamba/causal_conv1d_triton.py:119-123). SGLang leaves those
output rows unwritten (``torch.empty_like``, :470); here they are zeros, so the output is deterministic.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from poolsim.kernels._common import check, check_cu_seqlens
from poolsim.kernels.ops.kda_decode.naive import check_slots


def check_args(x, conv_state, weight, bias, slot_indices, cu_seqlens, has_initial_state, activation):
    check(x.dim() == 2, "x must be [tokens, dim]")
    total, dim = x.shape
    check(weight.dim() == 2 and weight.shape[0] == dim, f"weight must be [dim={dim}, width]")
    width = weight.shape[1]
    check(conv_state.dim() == 3 and tuple(conv_state.shape[1:]) == (dim, width - 1),
          f"conv_state must be [slots, dim={dim}, width-1={width - 1}], got {tuple(conv_state.shape)}")
    check(activation in (None, "silu", "swish"), f"activation must be None, 'silu' or 'swish', got {activation!r}")
    check_cu_seqlens(cu_seqlens, total)
    n = cu_seqlens.numel() - 1
    check_slots(slot_indices, n, conv_state.shape[0])
    check(has_initial_state is None or tuple(has_initial_state.shape) == (n,), "has_initial_state must be [N]")
    check(bias is None or tuple(bias.shape) == (dim,), "bias must be [dim]")
    return total, dim, width, n


def conv1d_prefill(x, conv_state, weight, bias, slot_indices, cu_seqlens, has_initial_state=None, activation="silu"):
    total, dim, width, n = check_args(x, conv_state, weight, bias, slot_indices, cu_seqlens, has_initial_state,
                                      activation)
    y = torch.empty(total, dim, dtype=x.dtype, device=x.device)
    cu = cu_seqlens.tolist()
    slots = slot_indices.tolist()
    init = [True] * n if has_initial_state is None else [bool(v) for v in has_initial_state.tolist()]
    w = weight.float()[:, None, :]  # [dim, 1, W] depthwise
    for i in range(n):
        if slots[i] < 0:
            y[cu[i]:cu[i + 1]] = 0
            continue
        seg = x[cu[i]:cu[i + 1]].float().t()  # [dim, L]
        state = torch.zeros(dim, width - 1, dtype=torch.float32, device=x.device)
        if init[i]:
            state = conv_state[slots[i]].float()
        window = torch.cat([state, seg], dim=1)  # [dim, W-1+L]
        out = F.conv1d(window[None], w, bias.float() if bias is not None else None, groups=dim)[0]  # [dim, L]
        if activation is not None:
            out = F.silu(out)
        y[cu[i]:cu[i + 1]] = out.t().to(x.dtype)
        conv_state[slots[i]] = window[:, -(width - 1):].to(conv_state.dtype)
    return y
