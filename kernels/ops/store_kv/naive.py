"""Torch references for ``store_kv`` (MHA/GQA K and V) and ``store_mla_kv`` (MLA latent).

An fp8 cache (a uint8 buffer with ``kv_dtype``, or an fp8 view) gets what SGLang writes: the source divided by the
layer's scale, cast to fp8 by torch, its bytes copied (memory_pool.py:2927-2936 MHA, :5013-5024 MLA).
"""

from __future__ import annotations

import torch

from poolsim.kernels._common import check, check_index_range, is_fp8, kv_view, to_cache_dtype


def check_pair(name: str, buf: torch.Tensor, src: torch.Tensor, loc: torch.Tensor) -> None:
    check(buf.dim() == 3 and src.dim() == 3, f"{name}: buffer and source must be [rows|tokens, heads, dim]")
    check(tuple(src.shape[1:]) == tuple(buf.shape[1:]),
          f"{name}: source rows {tuple(src.shape[1:])} do not match buffer rows {tuple(buf.shape[1:])}")
    check(src.shape[0] == loc.numel(), f"{name}: {src.shape[0]} tokens but {loc.numel()} slots in out_cache_loc")
    check(buf.is_floating_point() and src.is_floating_point(), f"{name}: float buffers only (uint8 with kv_dtype)")
    for what, t in (("buffer", buf), ("source", src)):
        # [heads, dim] of one token must read as one run of heads*dim elements
        check(t.stride(2) == 1 and (t.shape[1] == 1 or t.stride(1) == t.shape[2]),
              f"{name}: {what} must have contiguous [heads, dim] rows, strides {t.stride()}")


def check_loc(loc: torch.Tensor, rows: int) -> None:
    check(loc.dim() == 1 and not loc.is_floating_point(), "out_cache_loc must be a 1-D integer tensor")
    check_index_range("out_cache_loc", loc, rows)


def _write(buf: torch.Tensor, loc: torch.Tensor, src: torch.Tensor, scale: float | None) -> None:
    src = to_cache_dtype(src, buf.dtype, scale)
    if is_fp8(buf):  # index_put has no fp8 kernel: write the bytes, as SGLang's uint8 store does
        buf.view(torch.uint8)[loc] = src.view(torch.uint8)
    else:
        buf[loc] = src


def store_kv(k_buffer: torch.Tensor, v_buffer: torch.Tensor, out_cache_loc: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor, k_scale: float | None = None, v_scale: float | None = None,
             kv_dtype: torch.dtype | None = None) -> None:
    k_buffer, v_buffer = kv_view("k_buffer", k_buffer, kv_dtype), kv_view("v_buffer", v_buffer, kv_dtype)
    check_loc(out_cache_loc, k_buffer.shape[0])
    check(v_buffer.shape[0] == k_buffer.shape[0], "k_buffer and v_buffer differ in rows")
    check_pair("k", k_buffer, k, out_cache_loc)
    check_pair("v", v_buffer, v, out_cache_loc)
    loc = out_cache_loc.long()
    _write(k_buffer, loc, k, k_scale)
    _write(v_buffer, loc, v, v_scale)


def store_mla_kv(kv_buffer: torch.Tensor, out_cache_loc: torch.Tensor, kv: torch.Tensor,
                 k_rope: torch.Tensor | None = None, kv_dtype: torch.dtype | None = None) -> None:
    kv_buffer = kv_view("kv_buffer", kv_buffer, kv_dtype)
    check_loc(out_cache_loc, kv_buffer.shape[0])
    loc = out_cache_loc.long()
    if k_rope is None:
        check_pair("kv", kv_buffer, kv, out_cache_loc)
        _write(kv_buffer, loc, kv, None)
        return
    lora = kv.shape[-1]
    check_pair("k_nope", kv_buffer[..., :lora], kv, out_cache_loc)
    check_pair("k_rope", kv_buffer[..., lora:], k_rope, out_cache_loc)
    kv_all = torch.cat([to_cache_dtype(kv, kv_buffer.dtype, None), to_cache_dtype(k_rope, kv_buffer.dtype, None)], -1)
    _write(kv_buffer, loc, kv_all, None)
