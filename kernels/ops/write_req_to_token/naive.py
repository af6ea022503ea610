"""Torch reference for ``write_req_to_token``."""

from __future__ import annotations

import torch

from poolsim.kernels._common import capturing, check, check_index_range, check_lengths


def check_args(req_to_token, req_pool_indices, prefix_lens, seq_lens, out_cache_loc, prefix_loc):
    n = req_pool_indices.numel()
    check(req_to_token.dim() == 2 and req_to_token.dtype == torch.int32, "req_to_token must be int32 [rows, max_ctx]")
    check(req_to_token.stride(1) == 1, "req_to_token rows must be contiguous")
    for name, t in (("req_pool_indices", req_pool_indices), ("prefix_lens", prefix_lens), ("seq_lens", seq_lens),
                    ("out_cache_loc", out_cache_loc)):
        check(t.dim() == 1 and not t.is_floating_point(), f"{name} must be a 1-D integer tensor")
    check(prefix_lens.numel() == n and seq_lens.numel() == n, "req_pool_indices, prefix_lens, seq_lens differ in length")
    check_index_range("req_pool_indices", req_pool_indices, req_to_token.shape[0])
    check_lengths(seq_lens, prefix_lens, req_to_token.shape[1])
    if n and not capturing():
        extend = int((seq_lens - prefix_lens).sum())
        check(extend == out_cache_loc.numel(), f"out_cache_loc has {out_cache_loc.numel()} slots, the batch extends {extend}")
        if prefix_loc is not None:
            check(int(prefix_lens.sum()) == prefix_loc.numel(), "prefix_loc length != sum(prefix_lens)")
    if prefix_loc is not None:
        check(prefix_loc.dim() == 1 and not prefix_loc.is_floating_point(), "prefix_loc must be a 1-D integer tensor")


def write_req_to_token(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor,
                       seq_lens: torch.Tensor, out_cache_loc: torch.Tensor,
                       prefix_loc: torch.Tensor | None = None) -> None:
    check_args(req_to_token, req_pool_indices, prefix_lens, seq_lens, out_cache_loc, prefix_loc)
    rows = req_pool_indices.tolist()
    pre = prefix_lens.tolist()
    seq = seq_lens.tolist()
    start = pstart = 0
    for row, p, s in zip(rows, pre, seq):
        req_to_token[row, p:s] = out_cache_loc[start:start + s - p].to(torch.int32)
        start += s - p
        if prefix_loc is not None:
            req_to_token[row, :p] = prefix_loc[pstart:pstart + p].to(torch.int32)
            pstart += p
