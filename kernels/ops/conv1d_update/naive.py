"""Torch reference for ``conv1d_update``.

Per request and channel, window = ``[state[0 .. W-2], x]``; ``y = act(sum_j weight[:, j] * window[j] + bias)``;
the state keeps the last W-1 entries of the window (../shared/KDA.md section 3).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels._common import check
from kernels.ops.kda_decode.naive import check_slots


def check_args(x, conv_state, weight, bias, slot_indices, activation):
    check(x.dim() == 2, "x must be [N, dim]")
    n, dim = x.shape
    check(weight.dim() == 2 and weight.shape[0] == dim, f"weight must be [dim={dim}, width]")
    width = weight.shape[1]
    check(conv_state.dim() == 3 and tuple(conv_state.shape[1:]) == (dim, width - 1),
          f"conv_state must be [slots, dim={dim}, width-1={width - 1}], got {tuple(conv_state.shape)}")
    check(bias is None or tuple(bias.shape) == (dim,), "bias must be [dim]")
    check(activation in (None, "silu", "swish"), f"activation must be None, 'silu' or 'swish', got {activation!r}")
    check_slots(slot_indices, n, conv_state.shape[0])
    return n, dim, width


def conv1d_update(x, conv_state, weight, bias, slot_indices, activation="silu"):
    n, dim, width = check_args(x, conv_state, weight, bias, slot_indices, activation)
    live = slot_indices >= 0
    slots = slot_indices[live].long()
    state = torch.zeros(n, dim, width - 1, dtype=torch.float32, device=x.device)
    state[live] = conv_state[slots].float()
    window = torch.cat([state, x.float()[:, :, None]], dim=-1)  # [N, dim, W]
    y = (window * weight.float()[None]).sum(-1)
    if bias is not None:
        y = y + bias.float()
    if activation is not None:
        y = F.silu(y)
    conv_state[slots] = window[live, :, 1:].to(conv_state.dtype)
    return y.to(x.dtype)
