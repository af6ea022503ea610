"""Triton ``store_kv`` / ``store_mla_kv``: one launch copies up to two (source, buffer) pairs.

Grid ``(token blocks, column blocks of pair 0 + column blocks of pair 1)``; each program copies a
``[BLOCK_T, BLOCK_W]`` tile of flattened ``heads*dim`` rows to the rows named by ``out_cache_loc``.
An fp8 cache is written as SGLang writes it: the source is divided by the layer's scale and cast to fp8 by torch
first (memory_pool.py:2927-2936; the Triton interpreter's fp32->fp8 cast misrounds), then the kernel copies bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from poolsim.kernels._common import check, is_fp8, kv_view, to_cache_dtype
from poolsim.kernels.ops.store_kv.naive import check_loc, check_pair


@triton.jit
def _copy_tile(src, stride_src, dst, stride_dst, slots, toks, mask_t, cols, width):
    mask = mask_t[:, None] & (cols[None, :] < width)
    x = tl.load(src + toks[:, None] * stride_src + cols[None, :], mask=mask)
    tl.store(dst + slots[:, None] * stride_dst + cols[None, :], x.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _store_kv_kernel(
    loc, num_tokens,
    src0, stride_src0, dst0, stride_dst0, width0,
    src1, stride_src1, dst1, stride_dst1, width1,
    HAS_PAIR1: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr,
):
    pid_t = tl.program_id(0)
    pid_w = tl.program_id(1)
    toks = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    mask_t = toks < num_tokens
    slots = tl.load(loc + toks, mask=mask_t, other=0).to(tl.int64)
    toks = toks.to(tl.int64)
    blocks0 = tl.cdiv(width0, BLOCK_W)
    if pid_w < blocks0:
        cols = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
        _copy_tile(src0, stride_src0, dst0, stride_dst0, slots, toks, mask_t, cols, width0)
    elif HAS_PAIR1:
        cols = (pid_w - blocks0) * BLOCK_W + tl.arange(0, BLOCK_W)
        _copy_tile(src1, stride_src1, dst1, stride_dst1, slots, toks, mask_t, cols, width1)


def _launch(loc: torch.Tensor, dst0, src0, dst1=None, src1=None) -> None:
    n = loc.numel()
    if n == 0:
        return
    width0 = dst0.shape[1] * dst0.shape[2]
    width1 = dst1.shape[1] * dst1.shape[2] if dst1 is not None else 0
    block_w = min(512, triton.next_power_of_2(max(width0, width1, 16)))
    block_t = max(1, 4096 // block_w)  # ~4K elements per program
    grid = (triton.cdiv(n, block_t), triton.cdiv(width0, block_w) + triton.cdiv(width1, block_w))
    has1 = dst1 is not None
    _store_kv_kernel[grid](
        loc, n,
        src0, src0.stride(0), dst0, dst0.stride(0), width0,
        src1 if has1 else src0, src1.stride(0) if has1 else 0, dst1 if has1 else dst0,
        dst1.stride(0) if has1 else 0, width1,
        HAS_PAIR1=has1, BLOCK_T=block_t, BLOCK_W=block_w,
    )


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if is_fp8(t) else t


def store_kv(k_buffer: torch.Tensor, v_buffer: torch.Tensor, out_cache_loc: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor, k_scale: float | None = None, v_scale: float | None = None,
             kv_dtype: torch.dtype | None = None) -> None:
    """MHA/GQA: ``k_buffer[loc] = k; v_buffer[loc] = v`` in one launch.

    k_buffer ``[rows, kv_heads, head_dim]``, v_buffer ``[rows, kv_heads, v_head_dim]``; k, v ``[T, kv_heads, dim]``
    (token stride free, ``[heads, dim]`` contiguous); out_cache_loc ``[T]`` int32/int64 in ``[0, rows)``.
    Sources are cast to the buffer dtype. fp8 cache: uint8 buffers (SGLang's ``store_dtype``) with ``kv_dtype``
    ``torch.float8_e4m3fn``/``float8_e5m2``, or fp8 views; a source in another dtype is first divided by
    ``k_scale``/``v_scale`` (the layer's KV scales; None: 1) as SGLang does.
    """
    k_buffer, v_buffer = kv_view("k_buffer", k_buffer, kv_dtype), kv_view("v_buffer", v_buffer, kv_dtype)
    check_loc(out_cache_loc, k_buffer.shape[0])
    check(v_buffer.shape[0] == k_buffer.shape[0], "k_buffer and v_buffer differ in rows")
    check_pair("k", k_buffer, k, out_cache_loc)
    check_pair("v", v_buffer, v, out_cache_loc)
    if is_fp8(k_buffer) or k_scale is not None or v_scale is not None:
        k = to_cache_dtype(k, k_buffer.dtype, k_scale).contiguous()
        v = to_cache_dtype(v, v_buffer.dtype, v_scale).contiguous()
    _launch(out_cache_loc, _bytes(k_buffer), _bytes(k), _bytes(v_buffer), _bytes(v))


def store_mla_kv(kv_buffer: torch.Tensor, out_cache_loc: torch.Tensor, kv: torch.Tensor,
                 k_rope: torch.Tensor | None = None, kv_dtype: torch.dtype | None = None) -> None:
    """MLA: ``kv_buffer[loc] = kv`` (latent ``[T, 1, kv_lora_rank + rope]``), or, with ``k_rope``,
    ``kv_buffer[loc, :, :lora] = kv`` (``[T, 1, lora]``) and ``kv_buffer[loc, :, lora:] = k_rope`` in one launch.

    kv_buffer ``[rows, 1, kv_lora_rank + qk_rope_head_dim]``; out_cache_loc ``[T]`` in ``[0, rows)``. fp8 cache: a
    uint8 buffer with ``kv_dtype`` (or an fp8 view); sources are cast by torch first (SGLang's MLA pool takes no
    scale: the attention backend divides k by ``k_scale`` before, triton_backend.py:2326-2329).
    """
    kv_buffer = kv_view("kv_buffer", kv_buffer, kv_dtype)
    check_loc(out_cache_loc, kv_buffer.shape[0])
    if is_fp8(kv_buffer):
        kv = to_cache_dtype(kv, kv_buffer.dtype, None).contiguous()
        k_rope = None if k_rope is None else to_cache_dtype(k_rope, kv_buffer.dtype, None).contiguous()
    if k_rope is None:
        check_pair("kv", kv_buffer, kv, out_cache_loc)
        _launch(out_cache_loc, _bytes(kv_buffer), _bytes(kv))
        return
    lora = kv.shape[-1]
    check_pair("k_nope", kv_buffer[..., :lora], kv, out_cache_loc)
    check_pair("k_rope", kv_buffer[..., lora:], k_rope, out_cache_loc)
    buf = _bytes(kv_buffer)
    _launch(out_cache_loc, buf[..., :lora], _bytes(kv), buf[..., lora:], _bytes(k_rope))
