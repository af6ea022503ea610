"""Triton ``write_req_to_token``: one program per request copies its new slots into its row."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from poolsim.kernels.ops.write_req_to_token.naive import check_args


@triton.jit
def _write_req_to_token_kernel(
    req_to_token, stride_row, req_pool_indices, prefix_lens, seq_lens,
    loc_starts, out_cache_loc, prefix_starts, prefix_loc,
    HAS_PREFIX: tl.constexpr, BLOCK: tl.constexpr,
):
    i = tl.program_id(0)
    row = tl.load(req_pool_indices + i).to(tl.int64)
    pre = tl.load(prefix_lens + i).to(tl.int64)
    seq = tl.load(seq_lens + i).to(tl.int64)
    dst = req_to_token + row * stride_row
    src = out_cache_loc + tl.load(loc_starts + i)
    extend = seq - pre
    for b in range(tl.cdiv(extend, BLOCK)):
        off = b * BLOCK + tl.arange(0, BLOCK)
        mask = off < extend
        tl.store(dst + pre + off, tl.load(src + off, mask=mask).to(tl.int32), mask=mask)
    if HAS_PREFIX:
        psrc = prefix_loc + tl.load(prefix_starts + i)
        for b in range(tl.cdiv(pre, BLOCK)):
            off = b * BLOCK + tl.arange(0, BLOCK)
            mask = off < pre
            tl.store(dst + off, tl.load(psrc + off, mask=mask).to(tl.int32), mask=mask)


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    c = torch.cumsum(x.to(torch.int64), 0)
    return c - x.to(torch.int64)


def write_req_to_token(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor,
                       seq_lens: torch.Tensor, out_cache_loc: torch.Tensor,
                       prefix_loc: torch.Tensor | None = None) -> None:
    """``req_to_token[row_i, prefix_len_i:seq_len_i] = out_cache_loc[start_i : start_i + extend_i]``.

    req_to_token int32 ``[rows, max_context_len]``; req_pool_indices, prefix_lens, seq_lens ``[N]``;
    out_cache_loc ``[sum(seq_lens - prefix_lens)]`` (int32/int64, request after request);
    prefix_loc, optional, ``[sum(prefix_lens)]``: the matched prefix slots, written to ``[0, prefix_len_i)``.
    """
    check_args(req_to_token, req_pool_indices, prefix_lens, seq_lens, out_cache_loc, prefix_loc)
    n = req_pool_indices.numel()
    if n == 0:
        return
    loc_starts = _exclusive_cumsum(seq_lens - prefix_lens)
    has_prefix = prefix_loc is not None
    prefix_starts = _exclusive_cumsum(prefix_lens) if has_prefix else loc_starts
    _write_req_to_token_kernel[(n,)](
        req_to_token, req_to_token.stride(0), req_pool_indices, prefix_lens, seq_lens,
        loc_starts, out_cache_loc, prefix_starts, prefix_loc if has_prefix else out_cache_loc,
        HAS_PREFIX=has_prefix, BLOCK=1024,
    )
