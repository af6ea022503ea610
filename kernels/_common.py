"""Shared by the references and the Triton launchers: argument checks and Triton launch helpers.

Index checks read device values back to the host (one sync each); they are skipped while a CUDA graph
is being captured, where a sync is illegal, so warm a graph's shapes up eagerly first.
"""

from __future__ import annotations

import os

import torch


def interpreting() -> bool:
    """True when Triton runs kernels in its numpy interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def prev_pow2(n: int) -> int:
    return 1 << (int(n).bit_length() - 1)


def capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def check_shape(name: str, t: torch.Tensor, shape: tuple) -> None:
    check(tuple(t.shape) == tuple(shape), f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")


def check_index_range(name: str, idx: torch.Tensor, hi: int, allow_negative: bool = False) -> None:
    """Every entry in ``[0, hi)``; with ``allow_negative`` entries < 0 (padding, skipped) pass too."""
    if idx.numel() == 0 or capturing():
        return
    bad = idx >= hi if allow_negative else (idx >= hi) | (idx < 0)
    if bool(bad.any()):
        raise IndexError(f"{name}: index {int(idx[bad][0])} outside [0, {hi})")


def check_lengths(seq_lens: torch.Tensor, prefix_lens: torch.Tensor | None, max_len: int) -> None:
    if seq_lens.numel() == 0 or capturing():
        return
    check(int(seq_lens.min()) >= 0, "seq_lens must be >= 0")
    check(int(seq_lens.max()) <= max_len, f"seq_len {int(seq_lens.max())} exceeds the row length {max_len}")
    if prefix_lens is not None:
        check(int(prefix_lens.min()) >= 0, "prefix_lens must be >= 0")
        check(bool((prefix_lens <= seq_lens).all()), "prefix_len > seq_len")


def check_cu_seqlens(cu_seqlens: torch.Tensor, total: int) -> None:
    check(cu_seqlens.dim() == 1 and cu_seqlens.numel() >= 1, "cu_seqlens must be 1-D [N+1]")
    check(not cu_seqlens.is_floating_point(), "cu_seqlens must be an integer tensor")
    if capturing():
        return
    check(int(cu_seqlens[0]) == 0 and int(cu_seqlens[-1]) == total,
          f"cu_seqlens must start at 0 and end at the token count {total}")
    check(bool((cu_seqlens[1:] >= cu_seqlens[:-1]).all()), "cu_seqlens must be non-decreasing")


FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def kv_view(name: str, buf: torch.Tensor, kv_dtype: torch.dtype | None) -> torch.Tensor:
    """``buf`` seen as its KV cache dtype. SGLang keeps an fp8 KV cache in a uint8 buffer (``store_dtype``, because
    ``index_put`` has no fp8 kernel; mem_cache/memory_pool.py:2029-2033) and views it back as the fp8 ``dtype`` for the
    attention kernels (``_get_key_buffer``, :2848-2850). A uint8 buffer therefore needs ``kv_dtype`` to say which fp8;
    an fp8-typed view (what ``get_key_buffer`` returns) is taken as it is."""
    if buf.dtype == torch.uint8:
        check(kv_dtype in FP8_DTYPES,
              f"{name} is uint8 (an fp8 KV cache stored as SGLang does): pass kv_dtype=torch.float8_e4m3fn "
              f"or torch.float8_e5m2, got {kv_dtype}")
        return buf.view(kv_dtype)
    check(kv_dtype is None or kv_dtype == buf.dtype, f"{name} is {buf.dtype} but kv_dtype is {kv_dtype}")
    return buf


def is_fp8(t: torch.Tensor) -> bool:
    return t.dtype in FP8_DTYPES


def to_cache_dtype(src: torch.Tensor, dtype: torch.dtype, scale: float | None) -> torch.Tensor:
    """What SGLang's ``set_kv_buffer`` writes (memory_pool.py:2927-2936): a source in another dtype is divided by the
    layer's scale (when it has one) in its own dtype, then cast with torch's ``.to`` to the cache dtype."""
    if src.dtype == dtype:
        return src
    if scale is not None:
        src = src / scale
    return src.to(dtype)
