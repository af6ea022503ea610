"""Helpers for the kernel tests: device, poisoned pools, bit-exact guard checks."""

from __future__ import annotations

import pytest
import torch

from poolsim.kernels.testing import assert_close  # noqa: F401  (re-exported for the test modules)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_GPU = DEVICE == "cuda"


def fused(module: str):
    """The fused module of an op; skips when triton is not installed."""
    pytest.importorskip("triton")
    import importlib

    return importlib.import_module(f"poolsim.kernels.ops.{module}.fused")


def bits(t: torch.Tensor) -> torch.Tensor:
    """Same-width integer view, so NaN poison compares equal to itself."""
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_bit_equal(name: str, a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape, f"{name}: shapes differ"
    assert torch.equal(bits(a), bits(b)), f"{name}: not bit-identical"


def assert_rows_untouched(name: str, before: torch.Tensor, after: torch.Tensor, touched, dim: int = 0) -> None:
    """Every index of ``dim`` outside ``touched`` is bit-identical before and after."""
    keep = torch.ones(before.shape[dim], dtype=torch.bool)
    keep[torch.as_tensor([int(i) for i in touched if int(i) >= 0], dtype=torch.long)] = False
    idx = keep.nonzero().flatten().to(before.device)
    assert_bit_equal(name, before.index_select(dim, idx), after.index_select(dim, idx))


def poison_(t: torch.Tensor) -> torch.Tensor:
    return t.fill_(float("nan") if t.is_floating_point() else -1)


def randn(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE).to(dtype)
