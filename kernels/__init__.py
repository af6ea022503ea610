"""poolsim kernels: the ops GPU validation mode runs on the real pools.

Each op lives in ``kernels/ops/<op>/`` as ``naive.py`` (plain torch, the reference) and ``fused.py`` (Triton, or
fla-core for ``kda_prefill``) with the same signature. The functions here dispatch: the fused version for
CUDA tensors when Triton (and, for ``kda_prefill``, fla-core) is installed, the reference otherwise.
``use_backend("naive" | "fused" | "auto")`` or the environment variable ``POOLSIM_KERNELS`` forces one.
Importing this package imports neither torch nor triton.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os

HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_FLA = importlib.util.find_spec("fla") is not None
BACKENDS = ("auto", "naive", "fused")

_backend = os.environ.get("POOLSIM_KERNELS", "auto")
if _backend not in BACKENDS:
    raise ValueError(f"POOLSIM_KERNELS must be one of {BACKENDS}, got {_backend!r}")


def set_backend(name: str) -> None:
    global _backend
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    _backend = name


@contextlib.contextmanager
def use_backend(name: str):
    """Run the block with every op forced to ``name`` ("naive", "fused") or back to "auto"."""
    previous = _backend
    set_backend(name)
    try:
        yield
    finally:
        set_backend(previous)


def implementation(op: str, tensor) -> str:
    """The backend ``op`` runs with for data on ``tensor``'s device."""
    if _backend != "auto":
        return _backend
    fused_ok = HAS_TRITON and (HAS_FLA or op != "kda_prefill")
    return "fused" if fused_ok and tensor.is_cuda else "naive"


def _op(op: str, tensor):
    module = importlib.import_module(f"poolsim.kernels.ops.{op}.{implementation(op, tensor)}")
    return getattr(module, op)


def write_req_to_token(req_to_token, req_pool_indices, prefix_lens, seq_lens, out_cache_loc, prefix_loc=None):
    """See ``kernels.ops.write_req_to_token.fused.write_req_to_token``."""
    return _op("write_req_to_token", req_to_token)(req_to_token, req_pool_indices, prefix_lens, seq_lens,
                                                   out_cache_loc, prefix_loc)


def store_kv(k_buffer, v_buffer, out_cache_loc, k, v, k_scale=None, v_scale=None, kv_dtype=None):
    """See ``kernels.ops.store_kv.fused.store_kv`` (fp8: uint8 buffers with ``kv_dtype``)."""
    return _op("store_kv", k_buffer)(k_buffer, v_buffer, out_cache_loc, k, v, k_scale, v_scale, kv_dtype)


def store_mla_kv(kv_buffer, out_cache_loc, kv, k_rope=None, kv_dtype=None):
    """See ``kernels.ops.store_kv.fused.store_mla_kv`` (fp8: a uint8 buffer with ``kv_dtype``)."""
    module = importlib.import_module(f"poolsim.kernels.ops.store_kv.{implementation('store_kv', kv_buffer)}")
    return module.store_mla_kv(kv_buffer, out_cache_loc, kv, k_rope, kv_dtype)


def decode_attention(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, sm_scale=None,
                     num_kv_splits=None, k_scale=None, v_scale=None, kv_dtype=None):
    """See ``kernels.ops.decode_attention.fused.decode_attention`` (fp8: uint8 buffers with ``kv_dtype``)."""
    return _op("decode_attention", q)(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, sm_scale,
                                      num_kv_splits, k_scale, v_scale, kv_dtype)


def kda_decode(q, k, v, a, b, A_log, dt_bias, ssm_states, slot_indices, scale=None):
    """See ``kernels.ops.kda_decode.fused.kda_decode``."""
    return _op("kda_decode", q)(q, k, v, a, b, A_log, dt_bias, ssm_states, slot_indices, scale)


def conv1d_update(x, conv_state, weight, bias, slot_indices, activation="silu"):
    """See ``kernels.ops.conv1d_update.fused.conv1d_update``."""
    return _op("conv1d_update", x)(x, conv_state, weight, bias, slot_indices, activation)


def kda_prefill(q, k, v, a, b, A_log, dt_bias, ssm_states, slot_indices, cu_seqlens, has_initial_state=None,
                scale=None, chunk_size=64):
    """See ``kernels.ops.kda_prefill.fused.kda_prefill``; the CPU path is the chunked torch reference."""
    return _op("kda_prefill", q)(q, k, v, a, b, A_log, dt_bias, ssm_states, slot_indices, cu_seqlens,
                                 has_initial_state, scale, chunk_size)


def extend_attention(q, k_buffer, v_buffer, req_to_token, req_pool_indices, prefix_lens, extend_lens, sm_scale=None,
                     kv_dtype=None):
    """See ``kernels.ops.extend_attention.fused.extend_attention`` (fp8: uint8 buffers with ``kv_dtype``)."""
    return _op("extend_attention", q)(q, k_buffer, v_buffer, req_to_token, req_pool_indices, prefix_lens,
                                      extend_lens, sm_scale, kv_dtype)


def conv1d_prefill(x, conv_state, weight, bias, slot_indices, cu_seqlens, has_initial_state=None, activation="silu"):
    """See ``kernels.ops.conv1d_prefill.fused.conv1d_prefill``."""
    return _op("conv1d_prefill", x)(x, conv_state, weight, bias, slot_indices, cu_seqlens, has_initial_state,
                                    activation)


__all__ = [
    "HAS_FLA",
    "HAS_TRITON",
    "conv1d_prefill",
    "conv1d_update",
    "decode_attention",
    "extend_attention",
    "implementation",
    "kda_decode",
    "kda_prefill",
    "set_backend",
    "store_kv",
    "store_mla_kv",
    "use_backend",
    "write_req_to_token",
]
