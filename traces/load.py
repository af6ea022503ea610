"""``load_trace``: detect a file's format from its content, parse and validate it once; keep it, or stream a large one."""

from __future__ import annotations

import json
from pathlib import Path

from poolsim.traces import azure, mooncake, poolsim_format, sharegpt, tokens
from poolsim.traces.errors import TraceFormatError
from poolsim.traces.lines import HEAD_BYTES, Skips, head, numbered_lines
from poolsim.traces.request import Request
from poolsim.traces.trace import Trace

KEEP_BYTES = 64 << 20  # parsed requests kept by load_trace up to this size; a larger file streams
FORMATS = {m.FORMAT: m for m in (mooncake, azure, sharegpt, tokens, poolsim_format)}
SORTED_ON_LOAD = {sharegpt.FORMAT}  # formats without timestamps of their own; the others must be in order
_JSONL = (mooncake, poolsim_format, tokens, sharegpt)  # detection order for a JSON object line


def detect_format(path: str | Path) -> str:
    path = Path(path)
    if head(path).lstrip()[:1] == b"[":
        return sharegpt.FORMAT
    for number, raw in numbered_lines(path):
        return _detect_line(path, number, raw)
    raise TraceFormatError(path, None, None, "the file is empty, so its format cannot be detected")


def _detect_line(path: Path, number: int, raw: bytes) -> str:
    text = raw.decode("utf-8", "replace")
    if azure.looks_like(text) or (text.lstrip()[:1] not in "{[" and any(c in text for c in azure.COLUMNS)):
        return azure.FORMAT  # a CSV header naming an Azure column: the loader says which column is missing
    try:
        first = json.loads(text)
    except (ValueError, RecursionError):
        first = None
    if isinstance(first, dict):
        for module in _JSONL:
            if module.looks_like(first):
                return module.FORMAT
    raise TraceFormatError(path, number, None, f"cannot detect the trace format (one of {', '.join(FORMATS)}); "
                                               "name it with --format")


def load_trace(path: str | Path, format: str | None = None, skip_bad_lines: bool = False) -> Trace:
    """A trace from a file; raises TraceFormatError on the first bad line unless ``skip_bad_lines``.

    Line formats are read once here (validation, count, skipped lines). Their requests are kept while they fit
    in ``KEEP_BYTES`` (the whole Mooncake trace takes ~30 MB), so iterating does not parse the file again; a
    larger file is read again on every iteration instead, holding only the request being handed out (a
    million-request file streams). ShareGPT is read once and kept (it must be sorted).
    """
    path = Path(path)
    if path.is_dir():
        raise TraceFormatError(path, None, None, "is a directory, not a trace file")
    if not path.exists():
        raise TraceFormatError(path, None, None, "no such file")
    if not path.is_file():
        raise TraceFormatError(path, None, None, "not a regular file")
    if b"\0" in head(path):  # a disk image or a file of zeros: stop before reading gigabytes as one "line"
        raise TraceFormatError(path, None, None, f"binary content (NUL bytes in the first {HEAD_BYTES // 1024} KiB); "
                                                 "a trace is UTF-8 text")
    fmt = format or detect_format(path)
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; one of {', '.join(FORMATS)}")
    module = FORMATS[fmt]
    skips = Skips(skip_bad_lines)
    if fmt in SORTED_ON_LOAD:
        requests = list(module.iter_requests(path, skips))
        _require_requests(path, len(requests), skips, module)
        return Trace.from_requests(requests, name=path.stem, format=fmt, source_path=path, skipped_lines=skips.count)
    count, kept, room = 0, [], KEEP_BYTES
    for req in module.iter_requests(path, skips):
        count += 1
        if kept is not None:
            room -= _request_bytes(req)
            if room < 0:
                kept = None  # too large to keep: stream the file on each iteration
            else:
                kept.append(req)
    _require_requests(path, count, skips, module)
    if kept is not None:  # already in order and numbered 0..N-1: what a second pass would parse
        return Trace.from_requests(kept, name=path.stem, format=fmt, source_path=path, skipped_lines=skips.count)
    return Trace(lambda: module.iter_requests(path, Skips(skip_bad_lines)), name=path.stem, format=fmt,
                 source_path=path, skipped_lines=skips.count, num_requests=count)


def _request_bytes(req: Request) -> int:
    """About what a parsed request takes in memory (measured with tracemalloc: ~200 B, ~95 B a segment pair)."""
    size = 200
    if req.segments is not None:
        size += 96 * len(req.segments)
    if req.token_ids is not None:
        size += req.token_ids.nbytes
    return size


def _require_requests(path: Path, count: int, skips: Skips, module) -> None:
    """A trace without a single request cannot be simulated or described: say why instead."""
    if count:
        return
    why = getattr(module, "NO_REQUESTS", "it holds no request lines")
    skipped = f" ({skips.count} bad lines skipped)" if skips.count else ""
    raise TraceFormatError(path, None, None, f"no requests: {why}{skipped}")
