"""Triton varlen causal depthwise conv1d for prefill over pool slots (SGLang ``causal_conv1d_fn``'s job).

Grid ``(N, cdiv(max_len, BLOCK_T), cdiv(dim, BLOCK_D))``: a program convolves a ``[BLOCK_T, BLOCK_D]`` tile of one
sequence's tokens; input position ``s = t - (W-1) + j`` reads ``x`` where ``s >= 0`` and the slot's conv state
before it (zeros without an initial state). ``BLOCK_T >= W-1``, so only the first token block reads the state; that
block also writes the new state (the last W-1 inputs) after a barrier, as SGLang's chunk 0 program does, so no
other program can read a state already overwritten. A slot < 0 (padding) reads nothing and leaves the state
untouched (SGLang: mamba/causal_conv1d_triton.py:119-123); its output rows are zeros (SGLang leaves them unwritten).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from poolsim.kernels._common import capturing, check, next_pow2
from poolsim.kernels.ops.conv1d_prefill.naive import check_args


@triton.jit
def _conv1d_prefill_kernel(
    x, stride_xt, state, stride_ss, stride_sd, stride_sw, weight, stride_wd, stride_ww, bias,
    slot_indices, cu_seqlens, has_init, y, stride_yt, dim,
    W: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_W: tl.constexpr,
    HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
):
    i = tl.program_id(0)
    tb = tl.program_id(1)
    start = tl.load(cu_seqlens + i).to(tl.int64)
    length = tl.load(cu_seqlens + i + 1).to(tl.int64) - start
    if tb * BLOCK_T >= length:
        return
    od = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = od < dim
    t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
    mask_t = t < length
    slot = tl.load(slot_indices + i).to(tl.int64)
    if slot < 0:  # padding: nothing read, the state untouched, zero output rows
        tl.store(y + (start + t)[:, None] * stride_yt + od[None, :], tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
                 .to(y.dtype.element_ty), mask=mask_t[:, None] & mask_d[None, :])
        return
    # the lowest input position read from the state: -(W-1) with an initial state, 0 (none: zeros) without
    lo = -(W - 1) * (tl.load(has_init + i) != 0).to(tl.int64)
    p_state = state + slot * stride_ss + od[None, :] * stride_sd

    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for j in tl.static_range(W):
        s = t - (W - 1) + j  # input position; < 0 is the state's column W-1+s
        from_x = mask_t & (s >= 0)
        val = tl.load(x + (start + s)[:, None] * stride_xt + od[None, :],
                      mask=from_x[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
        from_state = mask_t & (s < 0) & (s >= lo)
        val += tl.load(p_state + (W - 1 + s)[:, None] * stride_sw,
                       mask=from_state[:, None] & mask_d[None, :], other=0.0).to(tl.float32)
        w = tl.load(weight + od * stride_wd + j * stride_ww, mask=mask_d, other=0.0).to(tl.float32)
        acc += val * w[None, :]
    if HAS_BIAS:
        acc += tl.load(bias + od, mask=mask_d, other=0.0).to(tl.float32)[None, :]
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(y + (start + t)[:, None] * stride_yt + od[None, :], acc.to(y.dtype.element_ty),
             mask=mask_t[:, None] & mask_d[None, :])

    if tb == 0:
        # new state column c holds input position length-(W-1)+c: from x, or (short sequences) the old state
        c = tl.arange(0, BLOCK_W)
        mask_c = c < W - 1
        s = length - (W - 1) + c
        new = tl.load(x + (start + s)[:, None] * stride_xt + od[None, :],
                      mask=(mask_c & (s >= 0))[:, None] & mask_d[None, :], other=0.0)
        old = tl.load(p_state + (W - 1 + s)[:, None] * stride_sw,
                      mask=(mask_c & (s < 0) & (s >= lo))[:, None] & mask_d[None, :], other=0.0)
        new = tl.where((s >= 0)[:, None], new.to(tl.float32), old.to(tl.float32))
        tl.debug_barrier()  # every read of the old state in this program is done
        tl.store(p_state + c[:, None] * stride_sw, new.to(state.dtype.element_ty),
                 mask=mask_c[:, None] & mask_d[None, :])


def conv1d_prefill(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   slot_indices: torch.Tensor, cu_seqlens: torch.Tensor, has_initial_state: torch.Tensor | None = None,
                   activation: str | None = "silu") -> torch.Tensor:
    """Causal depthwise conv over packed sequences, each continuing from (and leaving) its slot's conv state.

    x ``[tokens, dim]``, sequence i is ``x[cu_seqlens[i]:cu_seqlens[i+1]]``; conv_state ``[slots, dim, W-1]`` updated in
    place (any strides; SGLang's transposed pool view); weight ``[dim, W]``; bias ``[dim]`` or None; slot_indices
    ``[N]``; has_initial_state ``[N]`` bool (False: the window starts from zeros; None: all True); activation None or
    "silu"/"swish". Returns y ``[tokens, dim]`` in x's dtype; a padded sequence's (slot < 0) rows are zeros.
    Reads the longest sequence's length on the host (one sync): prefill runs eagerly.
    """
    total, dim, width, n = check_args(x, conv_state, weight, bias, slot_indices, cu_seqlens, has_initial_state,
                                      activation)
    check(width >= 2, "conv width must be >= 2")
    check(x.stride(1) == 1, "x: channels must be contiguous")
    check(not capturing(), "conv1d_prefill reads sequence lengths on the host: run it outside CUDA graph capture")
    y = torch.empty(total, dim, dtype=x.dtype, device=x.device)
    if n == 0 or total == 0:
        return y
    max_len = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    block_t = max(16, next_pow2(width - 1))
    block_d = min(128, next_pow2(dim))
    if has_initial_state is None:
        init = torch.ones(n, dtype=torch.int8, device=x.device)
    else:
        init = has_initial_state.to(torch.int8)
    _conv1d_prefill_kernel[(n, triton.cdiv(max_len, block_t), triton.cdiv(dim, block_d))](
        x, x.stride(0), conv_state, *conv_state.stride(), weight, *weight.stride(),
        bias if bias is not None else weight, slot_indices, cu_seqlens, init, y, y.stride(0), dim,
        W=width, BLOCK_T=block_t, BLOCK_D=block_d, BLOCK_W=max(2, next_pow2(width - 1)),
        HAS_BIAS=bias is not None, SILU=activation is not None, num_warps=4,
    )
    return y
