"""Torch reference for ``conv1d_update``.

Per request and channel, window = ``[state[0 .. W-2], x]``; ``y = act(sum_j weight[:, j] * window[j] + bias)``;
the state keeps the last W-1 entries of the window (../shared/KDA.md section 3). A slot < 0 (padding) is skipped: no
state is read or written, as SGLang 0.5.23's ``causal_conv1d_update`` returns early for ``pad_slot_id``
(mamba/causal_conv1d_triton.py:693-696). SGLang leaves that output row unwritten (``torch.empty_like``, :1100); here it
is zeros, so the output is deterministic.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from poolsim.kernels._common import check
from poolsim.kernels.ops.kda_decode.naive import check_slots


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
    window = torch.cat([conv_state[slots].float(), x[live].float()[:, :, None]], dim=-1)  # [live, dim, W]
    out = (window * weight.float()[None]).sum(-1)
    if bias is not None:
        out = out + bias.float()
    if activation is not None:
        out = F.silu(out)
    conv_state[slots] = window[:, :, 1:].to(conv_state.dtype)
    y = torch.zeros(n, dim, dtype=x.dtype, device=x.device)
    y[live] = out.to(x.dtype)
    return y
