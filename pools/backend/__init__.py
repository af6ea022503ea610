"""The array backend the pool bookkeeping is written over: numpy for the simulator, torch for a device.

Every pool takes ``device``: ``None`` selects numpy (no torch import anywhere); any torch device
string (``"cpu"``, ``"cuda"``, ``"cuda:1"``) selects torch. The pools call only the handful of
operations below, so both backends run the same index logic.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from poolsim.pools.backend.numpy_backend import LAZY_MMAP_BYTES, NUMPY_BACKEND, NumpyBackend  # noqa: F401  (re-exported)


class TorchBackend:
    name = "torch"
    int_dtype = None

    def __init__(self, device: str):
        import torch  # only the torch backend needs torch

        self.torch = torch
        self.device = torch.device(device)
        self.int_dtype = torch.int64

    def asarray(self, x: Any):
        t = self.torch
        if isinstance(x, t.Tensor):
            return x.to(device=self.device, dtype=t.int64).reshape(-1)
        host = np.asarray(x, dtype=np.int64).reshape(-1)
        if not host.flags.writeable:  # a tree node's frozen slots: torch cannot share read-only memory
            host = host.copy()
        return t.as_tensor(host, device=self.device)

    def arange(self, start: int, stop: int):
        return self.torch.arange(start, stop, dtype=self.torch.int64, device=self.device)

    def empty(self):
        return self.torch.empty((0,), dtype=self.torch.int64, device=self.device)

    def cat(self, parts):
        if len(parts) == 1:
            return parts[0]
        return self.torch.cat(list(parts)) if parts else self.empty()

    def unique(self, x):
        return self.torch.unique(x)

    def sort(self, x):
        return self.torch.sort(x, stable=True).values

    def keep(self, x):
        return x.clone()

    def to_numpy(self, x) -> np.ndarray:
        if isinstance(x, self.torch.Tensor):
            return x.detach().cpu().numpy().astype(np.int64).reshape(-1)
        return np.asarray(x, dtype=np.int64).reshape(-1)

    def zeros_int32(self, shape):
        return self.torch.zeros(shape, dtype=self.torch.int32, device=self.device)


def get_backend(device: str | None):
    """``None`` -> numpy; a torch device string -> torch on that device."""
    if device is None or device == "numpy":
        return NUMPY_BACKEND
    return TorchBackend(device)
