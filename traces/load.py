"""``load_trace``: detect a file's format from its content, validate it once, and stream it on iteration."""

from __future__ import annotations

import json
from pathlib import Path

from traces import azure, mooncake, poolsim_format, sharegpt, tokens
from traces.errors import TraceFormatError
from traces.lines import Skips
from traces.trace import Trace

FORMATS = {m.FORMAT: m for m in (mooncake, azure, sharegpt, tokens, poolsim_format)}
SORTED_ON_LOAD = {sharegpt.FORMAT}  # formats without timestamps of their own; the others must be in order
_JSONL = (mooncake, poolsim_format, tokens, sharegpt)  # detection order for a JSON object line


def detect_format(path: str | Path) -> str:
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(4096).lstrip()
        if head[:1] == b"[":
            return sharegpt.FORMAT
        f.seek(0)
        for number, raw in enumerate(f, 1):
            if raw.strip():
                return _detect_line(path, number, raw)
    raise TraceFormatError(path, None, None, "the file is empty, so its format cannot be detected")


def _detect_line(path: Path, number: int, raw: bytes) -> str:
    text = raw.decode("utf-8", "replace")
    if azure.looks_like(text):
        return azure.FORMAT
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

    Line formats are read twice: once here (validation, count, skipped lines) and again on every iteration,
    so only the request being handed out is in memory. ShareGPT is read once and kept (it must be sorted).
    """
    path = Path(path)
    if not path.is_file():
        raise TraceFormatError(path, None, None, "no such file")
    fmt = format or detect_format(path)
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; one of {', '.join(FORMATS)}")
    module = FORMATS[fmt]
    skips = Skips(skip_bad_lines)
    if fmt in SORTED_ON_LOAD:
        requests = list(module.iter_requests(path, skips))
        return Trace.from_requests(requests, name=path.stem, format=fmt, source_path=path, skipped_lines=skips.count)
    count = sum(1 for _ in module.iter_requests(path, skips))
    return Trace(lambda: module.iter_requests(path, Skips(skip_bad_lines)), name=path.stem, format=fmt,
                 source_path=path, skipped_lines=skips.count, num_requests=count)
