"""Torch reference for ``extend_attention`` (SGLang's ``extend_attention_fwd`` semantics, plain softmax).

Request i owns ``extend_lens[i]`` consecutive query rows of ``q``; its keys are the slots
``req_to_token[row, :prefix_len + extend_len]`` (the prefix from the cache, the new tokens already stored by
``store_kv``); new token t attends to the prefix and to new tokens 0..t (causal). An fp8 cache (uint8 buffers with
``kv_dtype``) is dequantized and q rounded to the fp8 dtype first, as SGLang's extend kernel does for its prefix part
(``q.to(k.dtype)``, kernels/ops/attention/extend_attention.py:619). SGLang reads the new tokens' K/V from the
projection (``k_extend``/``v_extend``, model dtype) rather than the cache; over a bf16/fp16/fp32 cache the values are
the same, over an fp8 one this op sees them rounded to fp8. KV scales are not taken (1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from poolsim.kernels._common import check, check_index_range, check_lengths, is_fp8, kv_view


def check_args(q, k_buffer, v_buffer, req_to_token, req_pool_indices, prefix_lens, extend_lens) -> None:
    n = req_pool_indices.numel()
    check(prefix_lens.numel() == n and extend_lens.numel() == n, "req_pool_indices, prefix_lens, extend_lens must be [N]")
    check(q.dim() == 3 and k_buffer.dim() == 3 and v_buffer.dim() == 3,
          "q [tokens, Hq, DK], k_buffer [rows, Hkv, DK], v_buffer [rows, Hkv, DV]")
    check(q.shape[0] == int(extend_lens.sum()), f"q has {q.shape[0]} rows, the batch extends {int(extend_lens.sum())}")
    check(k_buffer.shape[2] == q.shape[2], f"q head_dim {q.shape[2]} != k_buffer head_dim {k_buffer.shape[2]}")
    check(k_buffer.shape[1] > 0 and q.shape[1] % k_buffer.shape[1] == 0, "q heads not a multiple of kv heads")
    check_index_range("req_pool_indices", req_pool_indices, req_to_token.shape[0])
    check(v_buffer.shape[0] == k_buffer.shape[0] and v_buffer.shape[1] == k_buffer.shape[1],
          "v_buffer rows/heads differ from k_buffer")
    check(req_to_token.dim() == 2 and req_to_token.stride(1) == 1,
          "req_to_token must be [rows, max_ctx], rows contiguous")
    check_lengths(prefix_lens + extend_lens, prefix_lens, req_to_token.shape[1])
    if n:  # the kernel gathers through these entries without bounds checks
        seq = prefix_lens + extend_lens
        width = int(seq.max())
        table = req_to_token[req_pool_indices.long(), :width]
        used = torch.arange(width, device=table.device)[None, :] < seq[:, None]
        check_index_range("req_to_token entry", table[used], k_buffer.shape[0])


def extend_attention(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, req_to_token: torch.Tensor,
                     req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
                     sm_scale: float | None = None, kv_dtype: torch.dtype | None = None) -> torch.Tensor:
    k_buffer, v_buffer = kv_view("k_buffer", k_buffer, kv_dtype), kv_view("v_buffer", v_buffer, kv_dtype)
    check_args(q, k_buffer, v_buffer, req_to_token, req_pool_indices, prefix_lens, extend_lens)
    qk = q.to(k_buffer.dtype) if is_fp8(k_buffer) else q
    _, hq, dk = q.shape
    group = hq // k_buffer.shape[1]
    scale = dk ** -0.5 if sm_scale is None else sm_scale
    o = torch.zeros(q.shape[0], hq, v_buffer.shape[2], dtype=q.dtype, device=q.device)
    start = 0
    for row, p, e in zip(req_pool_indices.tolist(), prefix_lens.tolist(), extend_lens.tolist()):
        if e == 0:
            continue
        slots = req_to_token[row, : p + e].long()
        k = k_buffer[slots].float().repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, L, DK]
        v = v_buffer[slots].float().repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, L, DV]
        causal = torch.arange(p + e, device=q.device)[None, :] <= (p + torch.arange(e, device=q.device))[:, None]
        # softmax(q k^T * scale + mask) v; SDPA so a GPU run need not hold the [Hq, e, L] scores
        o_i = F.scaled_dot_product_attention(qk[start:start + e].float().transpose(0, 1), k, v, attn_mask=causal,
                                             scale=scale)
        o[start:start + e] = o_i.transpose(0, 1).to(q.dtype)
        start += e
    return o
