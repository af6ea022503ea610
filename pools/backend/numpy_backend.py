"""The numpy array backend of the pools (pools/backend/__init__.py picks it or torch). A module of its own so the mypyc build
compiles it: the pools call these thin wrappers thousands of times a step, and as interpreted functions each call
cost a Python frame; the torch backend stays in backend.py (mypyc drops the module it keeps in an attribute)."""

from __future__ import annotations

import mmap
from typing import Any, Sequence

import numpy as np

_INT64 = np.dtype(np.int64)


LAZY_MMAP_BYTES = 1 << 22  # numpy asks for huge pages from 4 MiB up


class NumpyBackend:
    name = "numpy"
    device = None
    int_dtype = np.int64

    def asarray(self, x: Any) -> np.ndarray:
        if type(x) is np.ndarray and x.ndim == 1 and x.dtype == _INT64:
            return x  # already what the pools hold (most calls: slot arrays handed back)
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

    def keep(self, x: np.ndarray) -> np.ndarray:
        """An array to hold on to after the caller is done: ``x`` itself when its memory can never change (the
        array owning it is read-only: a tree node's slots, which die freed), else a copy."""
        root = x
        while isinstance(root.base, np.ndarray):
            root = root.base
        return x if root.base is None and not root.flags.writeable else x.copy()

    def to_numpy(self, x: Any) -> np.ndarray:
        return self.asarray(x)  # the numpy backend's arrays are already host arrays

    def zeros_int32(self, shape: tuple[int, ...]) -> np.ndarray:
        # Zero pages mapped lazily, so a [rows, 1M] table costs only the pages touched. Large tables come from an
        # anonymous mmap rather than np.zeros: numpy asks the kernel for transparent huge pages on large arrays,
        # and then one token written to a row makes 2 MiB resident (the whole req_to_token table, 1 GiB for
        # Llama-3.1-8B on an H100, became resident over a long run).
        # Private and without huge pages where the platform has the flags: a first touch then faults in one plain
        # anonymous page, ~40 % cheaper than a page of the shared memory that mmap's default (MAP_SHARED) maps on
        # Linux; MADV_NOHUGEPAGE keeps a host with transparent huge pages "always" from making 2 MiB resident.
        nbytes = int(np.prod(shape, dtype=np.int64)) * 4
        if nbytes < LAZY_MMAP_BYTES:
            return np.zeros(shape, dtype=np.int32)
        private = getattr(mmap, "MAP_PRIVATE", None)
        anonymous = getattr(mmap, "MAP_ANONYMOUS", None)
        no_huge = getattr(mmap, "MADV_NOHUGEPAGE", None)
        if private is None or anonymous is None or no_huge is None:
            return np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.int32).reshape(shape)
        buf = mmap.mmap(-1, nbytes, flags=private | anonymous)
        buf.madvise(no_huge)
        return np.frombuffer(buf, dtype=np.int32).reshape(shape)


NUMPY_BACKEND = NumpyBackend()  # the one instance every numpy pool shares
