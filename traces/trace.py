"""A trace: requests in arrival order, streamed from their source on every iteration."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from poolsim.traces.request import Request


class Trace:
    """Iterable in arrival order; ``len()``, ``name``, ``source_path``, ``format``, ``skipped_lines``.

    Iterating calls ``open_requests()`` again: a file too large for load_trace to keep is read again, holding one
    request at a time (a million-request file streams). ``materialize()`` keeps a list instead.
    """

    def __init__(self, open_requests: Callable[[], Iterator[Request]], *, name: str, format: str,
                 source_path: str | Path | None = None, skipped_lines: int = 0, num_requests: int | None = None):
        self._open = open_requests
        self.name = name
        self.format = format
        self.source_path = None if source_path is None else Path(source_path)
        self.skipped_lines = skipped_lines
        self._len = num_requests

    @classmethod
    def from_requests(cls, requests: Iterable[Request], *, name: str, format: str = "generated",
                      source_path: str | Path | None = None, skipped_lines: int = 0) -> Trace:
        """An in-memory trace: requests sorted by arrival (stable) and renumbered 0..N-1."""
        ordered = sorted(requests, key=lambda r: r.arrival_s)
        items = [r if r.rid == i else dataclasses.replace(r, rid=i) for i, r in enumerate(ordered)]
        return cls(lambda: iter(items), name=name, format=format, source_path=source_path,
                   skipped_lines=skipped_lines, num_requests=len(items))

    def __iter__(self) -> Iterator[Request]:
        return self._open()

    def __len__(self) -> int:
        if self._len is None:
            self._len = sum(1 for _ in self)
        return self._len

    def __repr__(self) -> str:
        return f"Trace({self.name!r}, format={self.format!r}, requests={len(self)})"

    def materialize(self) -> Trace:
        items = list(self)
        return Trace(lambda: iter(items), name=self.name, format=self.format, source_path=self.source_path,
                     skipped_lines=self.skipped_lines, num_requests=len(items))

    def _derive(self, suffix: str, transform: Callable[[Iterator[Request]], Iterator[Request]]) -> Trace:
        return Trace(lambda: transform(iter(self)), name=f"{self.name}{suffix}", format=self.format,
                     source_path=self.source_path, skipped_lines=self.skipped_lines)


def slice_trace(trace: Trace, start_s: float = 0.0, end_s: float = math.inf, rebase: bool = True) -> Trace:
    """Requests with ``start_s <= arrival_s < end_s``, renumbered from 0; ``rebase`` shifts arrivals by -start_s.

    A session cut by the window keeps its later turns, whose prompts still hold the earlier turns' segments
    (their prefix is then simply not in the cache).
    """
    if not end_s > start_s >= 0:
        raise ValueError(f"need 0 <= start_s < end_s, got start_s={start_s}, end_s={end_s}")
    shift = start_s if rebase else 0.0

    def window(requests: Iterator[Request]) -> Iterator[Request]:
        rid = 0
        for r in requests:
            if r.arrival_s >= end_s:
                break  # arrivals are sorted
            if r.arrival_s >= start_s:
                yield dataclasses.replace(r, rid=rid, arrival_s=r.arrival_s - shift)
                rid += 1

    return trace._derive(f"[{start_s:g}s:{end_s:g}s]", window)


def scale_trace(trace: Trace, factor: float) -> Trace:
    """Arrival times divided by ``factor``: factor 2 doubles the request rate, lengths and identities unchanged."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"the rate factor must be a finite number > 0, got {factor}")

    def faster(requests: Iterator[Request]) -> Iterator[Request]:
        for r in requests:
            yield dataclasses.replace(r, arrival_s=r.arrival_s / factor)

    return trace._derive(f"[x{factor:g}]", faster)
