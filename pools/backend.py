"""The array backend the pool bookkeeping is written over: numpy for the simulator, torch for a device.

Every pool takes ``device``: ``None`` selects numpy (no torch import anywhere); any torch device
string (``"cpu"``, ``"cuda"``, ``"cuda:1"``) selects torch. The pools call only the handful of
operations below, so both backends run the same index logic.
"""

from __future__ import annotations

import mmap
from typing import Any, Sequence

import numpy as np

LAZY_MMAP_BYTES = 1 << 22  # numpy asks for huge pages from 4 MiB up


class NumpyBackend:
    name = "numpy"
    device = None
    int_dtype = np.int64

    def asarray(self, x: Any) -> np.ndarray:
        if hasattr(x, "detach"):  # a torch tensor handed to a numpy pool
            x = x.detach().cpu().numpy()
        return np.asarray(x, dtype=np.int64).reshape(-1)

    def arange(self, start: int, stop: int) -> np.ndarray:
        return np.arange(start, stop, dtype=np.int64)

    def empty(self) -> np.ndarray:
        return np.empty(0, dtype=np.int64)

    def cat(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else self.empty()

    def unique(self, x: np.ndarray) -> np.ndarray:
        return np.unique(x)  # sorted ascending, as torch.unique

    def sort(self, x: np.ndarray) -> np.ndarray:
        return np.sort(x, kind="stable")

    def copy(self, x: np.ndarray) -> np.ndarray:
        return x.copy()

    def keep(self, x: np.ndarray) -> np.ndarray:
        """An array to hold on to after the caller is done: ``x`` itself when its memory can never change (the
        array owning it is read-only: a tree node's slots, which die freed), else a copy."""
        root = x
        while isinstance(root.base, np.ndarray):
            root = root.base
        return x if root.base is None and not root.flags.writeable else x.copy()

    def to_numpy(self, x: Any) -> np.ndarray:
        return np.asarray(x, dtype=np.int64).reshape(-1)

    def zeros_int32(self, shape: tuple[int, ...]) -> np.ndarray:
        # Zero pages mapped lazily, so a [rows, 1M] table costs only the pages touched. Large tables come from an
        # anonymous mmap rather than np.zeros: numpy asks the kernel for transparent huge pages on large arrays,
        # and then one token written to a row makes 2 MiB resident (the whole req_to_token table, 1 GiB for
        # Llama-3.1-8B on an H100, became resident over a long run).
        nbytes = int(np.prod(shape, dtype=np.int64)) * 4
        if nbytes < LAZY_MMAP_BYTES:
            return np.zeros(shape, dtype=np.int32)
        return np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.int32).reshape(shape)


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

    def copy(self, x):
        return x.clone()

    def keep(self, x):
        return x.clone()

    def to_numpy(self, x) -> np.ndarray:
        if isinstance(x, self.torch.Tensor):
            return x.detach().cpu().numpy().astype(np.int64).reshape(-1)
        return np.asarray(x, dtype=np.int64).reshape(-1)

    def zeros_int32(self, shape):
        return self.torch.zeros(shape, dtype=self.torch.int32, device=self.device)


NUMPY = NumpyBackend()


def get_backend(device: str | None):
    """``None`` -> numpy; a torch device string -> torch on that device."""
    if device is None or device == "numpy":
        return NUMPY
    return TorchBackend(device)
