"""Triton extend (prefill) attention over ``req_to_token``-paged KV: a flash-attention forward per request.

Grid ``(N, cdiv(max_extend, BLOCK_M), Hq)``: a program holds ``BLOCK_M`` new tokens of one request and one query head,
walks the request's keys ``req_to_token[row, 0 .. prefix + extend)`` in ``BLOCK_N`` blocks (the prefix from the
cache, the new tokens' own rows already written by ``store_kv``), masks causally (new token m sees keys
``<= prefix + m``) and keeps an online softmax. Blocks past the tile's last causal key are not visited.
fp8 KV: tiles are loaded as fp8 and dequantized in registers; q is rounded to fp8 first (see the reference).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from poolsim.kernels._common import capturing, check, interpreting, is_fp8, kv_view, next_pow2
from poolsim.kernels.ops.decode_attention.fused import _head_blocks
from poolsim.kernels.ops.extend_attention.naive import check_args


@triton.jit
def _extend_attention_kernel(
    q, stride_qt, stride_qh, k_buf, stride_kr, stride_kh, v_buf, stride_vr, stride_vh,
    o, stride_ot, stride_oh, req_to_token, stride_rt, req_pool_indices, prefix_lens, extend_lens, q_start,
    sm_scale,
    GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_DK: tl.constexpr, BLOCK_DT: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KV_FP8: tl.constexpr, PRECISION: tl.constexpr,
):
    i = tl.program_id(0)
    mb = tl.program_id(1)
    h = tl.program_id(2)
    extend = tl.load(extend_lens + i)
    if mb * BLOCK_M >= extend:
        return
    prefix = tl.load(prefix_lens + i)
    row = tl.load(req_pool_indices + i).to(tl.int64)
    first = tl.load(q_start + i).to(tl.int64)
    kv_head = h // GROUP

    om = mb * BLOCK_M + tl.arange(0, BLOCK_M)  # new-token index within the request
    mask_m = om < extend
    od = tl.arange(0, BLOCK_DK)
    odv = tl.arange(0, BLOCK_DV)
    q_rows = q + (first + om)[:, None] * stride_qt + h * stride_qh
    bq = tl.load(q_rows + od[None, :], mask=mask_m[:, None] & (od[None, :] < DK), other=0.0)  # [BLOCK_M, BLOCK_DK]
    if KV_FP8:
        bq = bq.to(tl.float32)
    if BLOCK_DT > 0:
        odt = BLOCK_DK + tl.arange(0, BLOCK_DT)
        bqt = tl.load(q_rows + odt[None, :], mask=mask_m[:, None] & (odt[None, :] < DK), other=0.0)
        if KV_FP8:
            bqt = bqt.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    k_head = k_buf + kv_head.to(tl.int64) * stride_kh
    v_head = v_buf + kv_head.to(tl.int64) * stride_vh
    slot_row = req_to_token + row * stride_rt
    last = tl.minimum(prefix + extend, prefix + (mb + 1) * BLOCK_M)  # keys past the tile's last causal one: none
    for b in range(tl.cdiv(last, BLOCK_N)):
        kpos = b * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = kpos < last
        slots = tl.load(slot_row + kpos, mask=mask_n, other=0).to(tl.int64)
        bk = tl.load(k_head + slots[None, :] * stride_kr + od[:, None],
                     mask=mask_n[None, :] & (od[:, None] < DK), other=0.0)  # [BLOCK_DK, BLOCK_N]
        if KV_FP8:
            bk = bk.to(tl.float32)
        qk = tl.dot(bq, bk, input_precision=PRECISION)
        if BLOCK_DT > 0:
            bkt = tl.load(k_head + slots[None, :] * stride_kr + odt[:, None],
                          mask=mask_n[None, :] & (odt[:, None] < DK), other=0.0)
            if KV_FP8:
                bkt = bkt.to(tl.float32)
            qk += tl.dot(bqt, bkt, input_precision=PRECISION)
        visible = mask_m[:, None] & mask_n[None, :] & (kpos[None, :] <= prefix + om[:, None])
        qk = tl.where(visible, qk * sm_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows past the extend see no key at all
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(qk - m_safe[:, None])
        bv = tl.load(v_head + slots[:, None] * stride_vr + odv[None, :],
                     mask=mask_n[:, None] & (odv[None, :] < DV), other=0.0)  # [BLOCK_N, BLOCK_DV]
        if KV_FP8:
            bv = bv.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(bv.dtype), bv, input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(o + (first + om)[:, None] * stride_ot + h * stride_oh + odv[None, :], out.to(o.dtype.element_ty),
             mask=mask_m[:, None] & (odv[None, :] < DV))


def _blocks(head_width: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): small tiles in the interpreter, MLA-wide heads with smaller tiles on a GPU."""
    if interpreting():
        return 16, 16, 4
    return (64, 64, 4) if head_width <= 256 else (32, 32, 8)


def extend_attention(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, req_to_token: torch.Tensor,
                     req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
                     sm_scale: float | None = None, kv_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Prefill attention: request i's ``extend_lens[i]`` new tokens (consecutive rows of q) attend to their cached
    prefix and causally to each other, all read through ``req_to_token[req_pool_indices[i], :prefix + extend]``.

    q ``[sum(extend_lens), Hq, DK]``; k_buffer ``[rows, Hkv, DK]``, v_buffer ``[rows, Hkv, DV]`` (MLA absorbed:
    k_buffer = kv_buffer, v_buffer = ``kv_buffer[..., :kv_lora_rank]``); req_pool_indices, prefix_lens, extend_lens
    ``[N]``; returns o ``[tokens, Hq, DV]`` in q's dtype. q is cast to the KV dtype first (an fp8 cache: uint8 buffers
    with ``kv_dtype``, or fp8 views, dequantized on load). Reads the longest extend on the host (one sync): prefill
    runs eagerly, as in SGLang.
    """
    k_buffer, v_buffer = kv_view("k_buffer", k_buffer, kv_dtype), kv_view("v_buffer", v_buffer, kv_dtype)
    check_args(q, k_buffer, v_buffer, req_to_token, req_pool_indices, prefix_lens, extend_lens)
    check(not capturing(), "extend_attention reads extend lengths on the host: run it outside CUDA graph capture")
    for name, t in (("q", q), ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        check(t.stride(2) == 1, f"{name}: head_dim must be contiguous, strides {t.stride()}")
    tokens, hq, dk = q.shape
    hkv, dv = k_buffer.shape[1], v_buffer.shape[2]
    scale = dk ** -0.5 if sm_scale is None else sm_scale
    q_kv = q.to(k_buffer.dtype) if k_buffer.is_floating_point() else q
    o = torch.empty(tokens, hq, dv, dtype=torch.float32 if is_fp8(q_kv) else q.dtype, device=q.device)
    n = req_pool_indices.numel()
    if n == 0 or tokens == 0:
        return o.to(q.dtype)
    q_start = torch.cumsum(extend_lens, 0) - extend_lens
    block_dk, block_dt = _head_blocks(dk)
    block_m, block_n, warps = _blocks(block_dk + block_dt)
    precision = "ieee" if q_kv.dtype == torch.float32 else "tf32"
    _extend_attention_kernel[(n, triton.cdiv(int(extend_lens.max()), block_m), hq)](
        q_kv, q_kv.stride(0), q_kv.stride(1), k_buffer, k_buffer.stride(0), k_buffer.stride(1),
        v_buffer, v_buffer.stride(0), v_buffer.stride(1), o, o.stride(0), o.stride(1),
        req_to_token, req_to_token.stride(0), req_pool_indices, prefix_lens, extend_lens, q_start, scale,
        GROUP=hq // hkv, DK=dk, DV=dv, BLOCK_DK=block_dk, BLOCK_DT=block_dt, BLOCK_DV=max(16, next_pow2(dv)),
        BLOCK_M=block_m, BLOCK_N=block_n, KV_FP8=is_fp8(k_buffer), PRECISION=precision, num_warps=warps, num_stages=1,
    )
    return o.to(q.dtype)
