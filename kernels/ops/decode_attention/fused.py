"""Triton split-K decode attention over ``req_to_token``-paged KV (MHA/GQA and absorbed MLA).

Stage 1, grid ``(N, kv_heads * head_tiles, splits)``: a program takes ``BLOCK_H`` query heads that share
one KV head and one contiguous piece of the request's context, gathers K/V rows through
``req_to_token[row, t]`` and keeps an online softmax; it writes its normalised partial output and its
log-sum-exp. Stage 2, grid ``(N, Hq)``: merges the pieces by their log-sum-exp.
MLA (absorbed): q ``[N, H, 576]``, k_buffer = kv_buffer ``[rows, 1, 576]``, v_buffer = ``kv_buffer[..., :512]``;
then V is the first 512 columns of the K tile already loaded and is not read again (``SHARE_KV``).
fp8 KV (uint8 buffers with ``kv_dtype``, or fp8 views): tiles are loaded as fp8 bytes and dequantized to fp32 in
registers; q is rounded to fp8 first where SGLang's grouped kernel does it (Hq > Hkv). fp8 values are exact in tf32,
so the QK product equals SGLang's fp8 MMA up to summation order; SGLang also rounds the softmax weights p to fp8 for
the PV MMA (decode_attention.py:762), this kernel keeps them in tf32 (the Triton interpreter misrounds fp32->fp8).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from poolsim.kernels._common import check, interpreting, is_fp8, kv_view, next_pow2, prev_pow2
from poolsim.kernels.ops.decode_attention.naive import check_args, fp8_query

MAX_SPLITS = 32


@triton.jit
def _decode_attention_stage1(
    q, stride_qn, stride_qh,
    k_buf, stride_kr, stride_kh,
    v_buf, stride_vr, stride_vh,
    req_to_token, stride_rt, req_pool_indices, seq_lens,
    mid_o, mid_lse, sm_scale, num_q_heads, batch_bucket,
    GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DT: tl.constexpr, BLOCK_DV: tl.constexpr,
    SHARE_KV: tl.constexpr, KV_FP8: tl.constexpr, PRECISION: tl.constexpr, BLOCK_N: tl.constexpr,
):
    n = tl.program_id(0)
    tile = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    TILES: tl.constexpr = (GROUP + BLOCK_H - 1) // BLOCK_H
    kv_head = tile // TILES
    in_group = (tile % TILES) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = in_group < GROUP
    heads = kv_head * GROUP + in_group

    seq_len = tl.load(seq_lens + n)
    row = tl.load(req_pool_indices + n).to(tl.int64)
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)

    od = tl.arange(0, BLOCK_DK)
    odv = tl.arange(0, BLOCK_DV)
    q_rows = q + n.to(tl.int64) * stride_qn + heads[:, None] * stride_qh
    bq = tl.load(q_rows + od[None, :], mask=mask_h[:, None] & (od[None, :] < DK), other=0.0)  # [BLOCK_H, BLOCK_DK]
    if KV_FP8:
        bq = bq.to(tl.float32)
    if BLOCK_DT > 0:
        odt = BLOCK_DK + tl.arange(0, BLOCK_DT)
        bqt = tl.load(q_rows + odt[None, :], mask=mask_h[:, None] & (odt[None, :] < DK), other=0.0)
        if KV_FP8:
            bqt = bqt.to(tl.float32)

    m = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    s = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
    k_head = k_buf + kv_head.to(tl.int64) * stride_kh
    v_head = v_buf + kv_head.to(tl.int64) * stride_vh
    slot_row = req_to_token + row * stride_rt
    for b in range(tl.cdiv(tl.maximum(end - start, 0), BLOCK_N)):
        toks = start + b * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = toks < end
        slots = tl.load(slot_row + toks, mask=mask_n, other=0).to(tl.int64)
        bk = tl.load(k_head + slots[None, :] * stride_kr + od[:, None],
                     mask=mask_n[None, :] & (od[:, None] < DK), other=0.0)  # [BLOCK_DK, BLOCK_N]
        if KV_FP8:
            bk = bk.to(tl.float32)  # dequantize on load (the scale is folded into sm_scale)
        qk = tl.dot(bq, bk, input_precision=PRECISION)
        if BLOCK_DT > 0:
            bkt = tl.load(k_head + slots[None, :] * stride_kr + odt[:, None],
                          mask=mask_n[None, :] & (odt[:, None] < DK), other=0.0)
            if KV_FP8:
                bkt = bkt.to(tl.float32)
            qk += tl.dot(bqt, bkt, input_precision=PRECISION)
        qk = tl.where(mask_n[None, :], qk * sm_scale, float("-inf"))  # [BLOCK_H, BLOCK_N]
        m_new = tl.maximum(m, tl.max(qk, 1))  # finite: every block has a valid token
        alpha = tl.exp(m - m_new)
        p = tl.exp(qk - m_new[:, None])
        if SHARE_KV:
            bv = tl.trans(bk)  # [BLOCK_N, BLOCK_DV]: V is K's first DV columns
        else:
            bv = tl.load(v_head + slots[:, None] * stride_vr + odv[None, :],
                         mask=mask_n[:, None] & (odv[None, :] < DV), other=0.0)
            if KV_FP8:
                bv = bv.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(bv.dtype), bv, input_precision=PRECISION)
        s = s * alpha + tl.sum(p, 1)
        m = m_new

    mid = (n.to(tl.int64) * num_q_heads + heads) * num_splits + split  # [BLOCK_H]
    if end > start:
        out = acc / s[:, None]
        lse = m + tl.log(s)
    else:
        out = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
        lse = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    tl.store(mid_o + mid[:, None] * DV + odv[None, :], out, mask=mask_h[:, None] & (odv[None, :] < DV))
    tl.store(mid_lse + mid, lse, mask=mask_h)


@triton.jit
def _decode_attention_stage2(
    mid_o, mid_lse, o, stride_on, stride_oh, num_q_heads, num_splits, v_scale,
    DV: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    n = tl.program_id(0)
    h = tl.program_id(1)
    osp = tl.arange(0, BLOCK_S)
    odv = tl.arange(0, BLOCK_DV)
    mask_s = osp < num_splits
    base = (n.to(tl.int64) * num_q_heads + h) * num_splits
    lse = tl.load(mid_lse + base + osp, mask=mask_s, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # all pieces empty (seq_len 0): output zeros
    w = tl.exp(lse - m)  # [BLOCK_S]
    parts = tl.load(mid_o + (base + osp)[:, None] * DV + odv[None, :],
                    mask=mask_s[:, None] & (odv[None, :] < DV), other=0.0)  # [BLOCK_S, BLOCK_DV]
    total = tl.sum(w, 0)
    out = tl.sum(w[:, None] * parts, 0) / tl.where(total > 0, total, 1.0) * v_scale
    tl.store(o + n.to(tl.int64) * stride_on + h * stride_oh + odv, out.to(o.dtype.element_ty), mask=odv < DV)


def _configs(wide: bool):
    if interpreting():
        return [triton.Config({"BLOCK_N": 16}, num_warps=4, num_stages=1)]
    blocks = (16, 32) if wide else (32, 64)
    return [triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=st)
            for bn in blocks for w in (4, 8) for st in (1, 2, 3)]


_KEY = ["GROUP", "DK", "DV", "BLOCK_H", "SHARE_KV", "KV_FP8", "PRECISION", "batch_bucket"]  # batch_bucket: key only
_stage1_narrow = triton.autotune(_configs(False), key=_KEY)(_decode_attention_stage1)
_stage1_wide = triton.autotune(_configs(True), key=_KEY)(_decode_attention_stage1)  # MLA-sized heads


def default_num_splits(batch: int, tiles: int, device: torch.device) -> int:
    """Enough programs for ~4 per SM; the split count does not depend on seq_lens (no host sync)."""
    if device.type != "cuda":
        return 2
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(MAX_SPLITS, triton.cdiv(4 * sms, max(1, batch * tiles))))


def _head_blocks(dk: int) -> tuple[int, int]:
    if dk <= 16 or dk == next_pow2(dk):
        return max(16, next_pow2(dk)), 0
    main = prev_pow2(dk)
    return main, max(16, next_pow2(dk - main))


def decode_attention_fwd(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, sm_scale, num_kv_splits,
                         v_scale=1.0):
    n, hq, dk = q.shape
    hkv, dv = k_buffer.shape[1], v_buffer.shape[2]
    group = hq // hkv
    for name, t in (("q", q), ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        check(t.stride(2) == 1, f"{name}: head_dim must be contiguous, strides {t.stride()}")
    block_h = 16
    tiles = hkv * triton.cdiv(group, block_h)
    splits = num_kv_splits or default_num_splits(n, tiles, q.device)
    check(1 <= splits <= 128, f"num_kv_splits {splits} out of range [1, 128]")
    block_dk, block_dt = _head_blocks(dk)
    block_dv = max(16, next_pow2(dv))
    share_kv = (v_buffer.data_ptr() == k_buffer.data_ptr() and v_buffer.stride()[:2] == k_buffer.stride()[:2]
                and dv == block_dk and dv <= dk)
    kv_fp8 = is_fp8(k_buffer)
    # fp8 tiles are dequantized to fp32; tf32 holds fp8 (and bf16) values exactly
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    o = torch.empty(n, hq, dv, dtype=torch.float32 if is_fp8(q) else q.dtype, device=q.device)
    if n == 0:
        return o
    mid_o = torch.empty(n, hq, splits, dv, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(n, hq, splits, dtype=torch.float32, device=q.device)
    stage1 = _stage1_wide if block_dk + block_dt > 256 else _stage1_narrow
    stage1[(n, tiles, splits)](
        q, q.stride(0), q.stride(1),
        k_buffer, k_buffer.stride(0), k_buffer.stride(1),
        v_buffer, v_buffer.stride(0), v_buffer.stride(1),
        req_to_token, req_to_token.stride(0), req_pool_indices, seq_lens,
        mid_o, mid_lse, sm_scale, hq, min(256, next_pow2(n)),
        GROUP=group, DK=dk, DV=dv, BLOCK_H=block_h, BLOCK_DK=block_dk, BLOCK_DT=block_dt, BLOCK_DV=block_dv,
        SHARE_KV=share_kv, KV_FP8=kv_fp8, PRECISION=precision,
    )
    _decode_attention_stage2[(n, hq)](
        mid_o, mid_lse, o, o.stride(0), o.stride(1), hq, splits, v_scale,
        DV=dv, BLOCK_S=max(2, next_pow2(splits)), BLOCK_DV=block_dv,
        num_warps=4,
    )
    return o


def decode_attention(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, req_to_token: torch.Tensor,
                     req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float | None = None,
                     num_kv_splits: int | None = None, k_scale: float | None = None, v_scale: float | None = None,
                     kv_dtype: torch.dtype | None = None) -> torch.Tensor:
    """One query token per request attends over KV slots ``req_to_token[req_pool_indices[i], :seq_lens[i]]``.

    MHA/GQA: q ``[N, Hq, DK]``, k_buffer ``[rows, Hkv, DK]``, v_buffer ``[rows, Hkv, DV]``, Hq a multiple of Hkv.
    MLA absorbed: q ``[N, H, kv_lora_rank + rope]``, k_buffer = kv_buffer ``[rows, 1, lora + rope]``,
    v_buffer = ``kv_buffer[..., :kv_lora_rank]``; pass ``sm_scale`` = (qk_nope + qk_rope)^-1/2.
    req_to_token int32 ``[rows, max_ctx]``; req_pool_indices, seq_lens ``[N]``. q is cast to the KV dtype first
    (as SGLang does; for an fp8 cache only when Hq > Hkv, as SGLang's grouped kernel does); returns o ``[N, Hq, DV]``
    in q's dtype; a request with seq_len 0 gets zeros. ``sm_scale`` defaults to DK^-1/2; ``num_kv_splits`` (split-K
    pieces per request) defaults to enough programs to fill the GPU. fp8 cache: uint8 buffers (SGLang's
    ``store_dtype``) with ``kv_dtype``, or fp8 views; ``k_scale``/``v_scale`` are the layer's KV scales (None: 1).
    """
    k_buffer, v_buffer = kv_view("k_buffer", k_buffer, kv_dtype), kv_view("v_buffer", v_buffer, kv_dtype)
    check_args(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens)
    scale = (q.shape[2] ** -0.5 if sm_scale is None else sm_scale) * (1.0 if k_scale is None else k_scale)
    # SGLang casts q to the KV cache's dtype (an fp32 q over a bf16 cache); the output keeps q's dtype
    if is_fp8(k_buffer):
        q_kv = fp8_query(q, k_buffer)
    else:
        q_kv = q.to(k_buffer.dtype) if k_buffer.is_floating_point() else q
    o = decode_attention_fwd(q_kv, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, scale,
                             num_kv_splits, 1.0 if v_scale is None else v_scale)
    return o.to(q.dtype)
