"""Torch references for ``store_kv`` (MHA/GQA K and V) and ``store_mla_kv`` (MLA latent)."""

from __future__ import annotations

import torch

from kernels._common import check, check_index_range


def check_pair(name: str, buf: torch.Tensor, src: torch.Tensor, loc: torch.Tensor) -> None:
    check(buf.dim() == 3 and src.dim() == 3, f"{name}: buffer and source must be [rows|tokens, heads, dim]")
    check(tuple(src.shape[1:]) == tuple(buf.shape[1:]),
          f"{name}: source rows {tuple(src.shape[1:])} do not match buffer rows {tuple(buf.shape[1:])}")
    check(src.shape[0] == loc.numel(), f"{name}: {src.shape[0]} tokens but {loc.numel()} slots in out_cache_loc")
    check(buf.is_floating_point() and src.is_floating_point(), f"{name}: float buffers only")
    for what, t in (("buffer", buf), ("source", src)):
        # [heads, dim] of one token must read as one run of heads*dim elements
        check(t.stride(2) == 1 and (t.shape[1] == 1 or t.stride(1) == t.shape[2]),
              f"{name}: {what} must have contiguous [heads, dim] rows, strides {t.stride()}")


def check_loc(loc: torch.Tensor, rows: int) -> None:
    check(loc.dim() == 1 and not loc.is_floating_point(), "out_cache_loc must be a 1-D integer tensor")
    check_index_range("out_cache_loc", loc, rows)


def store_kv(k_buffer: torch.Tensor, v_buffer: torch.Tensor, out_cache_loc: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor) -> None:
    check_loc(out_cache_loc, k_buffer.shape[0])
    check(v_buffer.shape[0] == k_buffer.shape[0], "k_buffer and v_buffer differ in rows")
    check_pair("k", k_buffer, k, out_cache_loc)
    check_pair("v", v_buffer, v, out_cache_loc)
    loc = out_cache_loc.long()
    k_buffer[loc] = k.to(k_buffer.dtype)
    v_buffer[loc] = v.to(v_buffer.dtype)


def store_mla_kv(kv_buffer: torch.Tensor, out_cache_loc: torch.Tensor, kv: torch.Tensor,
                 k_rope: torch.Tensor | None = None) -> None:
    check_loc(out_cache_loc, kv_buffer.shape[0])
    loc = out_cache_loc.long()
    if k_rope is None:
        check_pair("kv", kv_buffer, kv, out_cache_loc)
        kv_buffer[loc] = kv.to(kv_buffer.dtype)
        return
    lora = kv.shape[-1]
    check_pair("k_nope", kv_buffer[..., :lora], kv, out_cache_loc)
    check_pair("k_rope", kv_buffer[..., lora:], k_rope, out_cache_loc)
    kv_buffer[loc, :, :lora] = kv.to(kv_buffer.dtype)
    kv_buffer[loc, :, lora:] = k_rope.to(kv_buffer.dtype)
