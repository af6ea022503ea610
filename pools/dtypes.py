"""Dtype names the pools accept and their storage sizes (fp8 is stored as one byte, as SGLang's uint8)."""

DTYPE_BYTES = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}

_TORCH_STORE = {
    "float32": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "fp8_e4m3": "uint8",  # SGLang stores fp8 KV as uint8 and views it per kernel
    "fp8_e5m2": "uint8",
}


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}") from None


def torch_store_dtype(dtype: str):
    import torch

    dtype_bytes(dtype)
    return getattr(torch, _TORCH_STORE[dtype])
