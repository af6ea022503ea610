"""Triton causal conv1d update over pool slots.

Grid ``(N, cdiv(dim, BLOCK_D))``: a program loads the ``[BLOCK_D, W-1]`` state tile of one slot (dim may be
the unit-stride axis, as in SGLang's transposed pool view), convolves it with the new token, stores the
shifted window back. A slot < 0 (padding) reads nothing and leaves its state untouched, as SGLang 0.5.23's
``causal_conv1d_update`` does (mamba/causal_conv1d_triton.py:693-696); SGLang also leaves that output row unwritten
(``torch.empty_like``, :1100), this kernel writes zeros there so the output is deterministic (no consumer reads it:
the KDA decode returns zeros for a padded row without loading q, k, v).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from poolsim.kernels._common import check, next_pow2
from poolsim.kernels.ops.conv1d_update.naive import check_args


@triton.jit
def _conv1d_update_kernel(
    x, stride_xn, state, stride_ss, stride_sd, stride_sw, weight, stride_wd, stride_ww, bias,
    slot_indices, y, stride_yn, dim,
    W: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    od = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    ow = tl.arange(0, BLOCK_W)
    mask_d = od < dim
    in_state = ow < W - 1

    slot = tl.load(slot_indices + n).to(tl.int64)
    if slot < 0:  # padding: nothing read, the state untouched, a zero output row
        tl.store(y + n * stride_yn + od, tl.zeros([BLOCK_D], dtype=tl.float32).to(y.dtype.element_ty), mask=mask_d)
        return
    xt = tl.load(x + n * stride_xn + od, mask=mask_d, other=0.0).to(tl.float32)  # [BLOCK_D]
    p_s = state + slot * stride_ss + od[:, None] * stride_sd + ow[None, :] * stride_sw
    old = tl.load(p_s, mask=mask_d[:, None] & in_state[None, :], other=0.0).to(tl.float32)  # window[0 .. W-2]
    # window[1 .. W-2] again, one column to the left: the state after the shift
    shifted = tl.load(p_s + stride_sw, mask=mask_d[:, None] & (ow[None, :] < W - 2), other=0.0).to(tl.float32)

    p_w = weight + od[:, None] * stride_wd
    w_state = tl.load(p_w + ow[None, :] * stride_ww, mask=mask_d[:, None] & in_state[None, :], other=0.0)
    w_last = tl.load(weight + od * stride_wd + (W - 1) * stride_ww, mask=mask_d, other=0.0)
    acc = tl.sum(old * w_state.to(tl.float32), 1) + xt * w_last.to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias + od, mask=mask_d, other=0.0).to(tl.float32)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(y + n * stride_yn + od, acc.to(y.dtype.element_ty), mask=mask_d)
    new = tl.where(ow[None, :] == W - 2, xt[:, None], shifted)
    tl.store(p_s, new.to(state.dtype.element_ty), mask=mask_d[:, None] & in_state[None, :])


def conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  slot_indices: torch.Tensor, activation: str | None = "silu") -> torch.Tensor:
    """Advance each request's conv window by its token ``x`` and return the convolved (and SiLU'd) output.

    x ``[N, dim]`` (q|k|v channels of one token per request); conv_state ``[slots, dim, W-1]`` updated in place
    (any strides; SGLang passes the pool's ``conv.transpose(-1, -2)``, unit stride along dim); weight
    ``[dim, W]``; bias ``[dim]`` or None; slot_indices ``[N]``, slot < 0 is padding: its row of y is zeros (SGLang
    leaves it unwritten) and its state untouched;
    activation None or "silu"/"swish". Returns y ``[N, dim]`` in x's dtype.
    """
    n, dim, width = check_args(x, conv_state, weight, bias, slot_indices, activation)
    check(width >= 2, "conv width must be >= 2")
    check(x.stride(1) == 1, "x: channels must be contiguous")
    y = torch.empty(n, dim, dtype=x.dtype, device=x.device)
    if n == 0:
        return y
    block_d = min(256, next_pow2(dim))
    _conv1d_update_kernel[(n, triton.cdiv(dim, block_d))](
        x, x.stride(0), conv_state, *conv_state.stride(), weight, *weight.stride(),
        bias if bias is not None else weight, slot_indices, y, y.stride(0), dim,
        W=width, BLOCK_W=max(2, next_pow2(width - 1)), BLOCK_D=block_d,
        HAS_BIAS=bias is not None, SILU=activation is not None, num_warps=4,
    )
    return y
