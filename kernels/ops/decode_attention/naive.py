"""Torch reference for ``decode_attention``: a plain softmax per request over its gathered slots.

fp8 KV (SGLang 0.5.23's Triton decode, kernels/ops/attention/decode_attention.py): K and V are dequantized (fp8
values, times ``k_scale`` folded into ``sm_scale`` at :1257/:1282/:1305, times ``v_scale`` on the output at :1016);
with more than one query head per KV head q is first rounded to the fp8 dtype (the grouped kernel's
``q.to(K_Buffer.dtype.element_ty)``, :661), with one (the MHA kernel, :352) it is not.
"""

from __future__ import annotations

import torch

from poolsim.kernels._common import capturing, check, check_index_range, check_lengths, is_fp8, kv_view


def check_args(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens):
    check(q.dim() == 3 and k_buffer.dim() == 3 and v_buffer.dim() == 3,
          "q [N, Hq, DK], k_buffer [rows, Hkv, DK], v_buffer [rows, Hkv, DV]")
    n, hq, dk = q.shape
    rows, hkv, _ = k_buffer.shape
    check(k_buffer.shape[2] == dk, f"q head_dim {dk} != k_buffer head_dim {k_buffer.shape[2]}")
    check(v_buffer.shape[0] == rows and v_buffer.shape[1] == hkv, "v_buffer rows/heads differ from k_buffer")
    check(hkv > 0 and hq % hkv == 0, f"q heads {hq} not a multiple of kv heads {hkv}")
    check(req_pool_indices.numel() == n and seq_lens.numel() == n, "req_pool_indices/seq_lens must be [N]")
    check(req_to_token.dim() == 2 and req_to_token.stride(1) == 1, "req_to_token must be [rows, max_ctx], rows contiguous")
    check_index_range("req_pool_indices", req_pool_indices, req_to_token.shape[0])
    check_lengths(seq_lens, None, req_to_token.shape[1])
    if n and not capturing():
        # the kernel gathers through these entries without bounds checks
        width = int(seq_lens.max())
        table = req_to_token[req_pool_indices.long(), :width]
        used = torch.arange(width, device=table.device)[None, :] < seq_lens[:, None]
        check_index_range("req_to_token entry", table[used], rows)


def gathered_slots(req_to_token, req_pool_indices, seq_lens) -> list[torch.Tensor]:
    return [req_to_token[r, :s].long() for r, s in zip(req_pool_indices.tolist(), seq_lens.tolist())]


def fp8_query(q: torch.Tensor, k_buffer: torch.Tensor) -> torch.Tensor:
    """q as SGLang's decode kernels multiply it with an fp8 K: rounded to fp8 when heads are grouped."""
    group = q.shape[1] // k_buffer.shape[1]
    return q.to(k_buffer.dtype) if is_fp8(k_buffer) and group > 1 else q


def decode_attention(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, req_to_token: torch.Tensor,
                     req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, sm_scale: float | None = None,
                     num_kv_splits: int | None = None, k_scale: float | None = None, v_scale: float | None = None,
                     kv_dtype: torch.dtype | None = None) -> torch.Tensor:
    k_buffer, v_buffer = kv_view("k_buffer", k_buffer, kv_dtype), kv_view("v_buffer", v_buffer, kv_dtype)
    check_args(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens)
    n, hq, dk = q.shape
    group = hq // k_buffer.shape[1]
    scale = (dk ** -0.5 if sm_scale is None else sm_scale) * (1.0 if k_scale is None else k_scale)
    qk = fp8_query(q, k_buffer).float()
    o = torch.zeros(n, hq, v_buffer.shape[2], dtype=q.dtype, device=q.device)
    for i, slots in enumerate(gathered_slots(req_to_token, req_pool_indices, seq_lens)):
        if slots.numel() == 0:
            continue  # an empty context attends to nothing: zeros
        k = k_buffer[slots].float().repeat_interleave(group, dim=1)  # [L, Hq, DK]
        v = v_buffer[slots].float().repeat_interleave(group, dim=1)  # [L, Hq, DV]
        s = torch.einsum("hd,lhd->hl", qk[i], k) * scale
        out = torch.einsum("hl,lhd->hd", torch.softmax(s, dim=-1), v)
        o[i] = (out if v_scale is None else out * v_scale).to(q.dtype)
    return o
