"""Comparison helpers shared by the tests and the GPU benchmark (fla's relative-RMS ``assert_close``)."""

from __future__ import annotations

import torch


def rel_rms_error(ref: torch.Tensor, out: torch.Tensor) -> float:
    """``rms(ref - out) / rms(ref)`` in fp64; 0 when both are all zeros."""
    ref64, out64 = ref.detach().double(), out.detach().double()
    err = (ref64 - out64).pow(2).mean().sqrt().item()
    base = ref64.pow(2).mean().sqrt().item()
    return err / base if base > 0 else err


def assert_close(name: str, ref: torch.Tensor, out: torch.Tensor, ratio: float) -> None:
    assert ref.shape == out.shape, f"{name}: shapes differ, {tuple(ref.shape)} vs {tuple(out.shape)}"
    assert not out.isnan().any(), f"{name}: output has NaN"
    err = rel_rms_error(ref, out)
    assert err <= ratio, f"{name}: relative RMS error {err:.3e} > {ratio:.1e}"
