"""Azure LLM inference CSV (2023/2024): ``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``.

``TIMESTAMP`` is a datetime (``2023-11-16 18:15:46.6805900``, optionally with ``T``, ``Z`` or an offset);
arrivals are seconds after the first row, which must never go backwards. The trace carries no prefix identity,
so every prompt is private.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import date
from pathlib import Path

from poolsim.traces.errors import TraceFormatError
from poolsim.traces.lines import Skips, build, decode, in_order, numbered_lines
from poolsim.traces.request import Request

FORMAT = "azure"
COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
NAMES = {"arrival_s": "TIMESTAMP", "input_len": "ContextTokens", "output_len": "GeneratedTokens"}
_TIME = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-]\d{2}:?\d{2})?", re.ASCII)


def looks_like(first_line: str) -> bool:
    return all(c in first_line for c in COLUMNS)


def parse_time(text: str) -> tuple[int, float]:
    """``(whole seconds since 1970-01-01 UTC, fraction)``; kept apart so sub-microsecond digits survive."""
    m = _TIME.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"{text!r:.40} is not a datetime like 2023-11-16 18:15:46.6805900")
    day = date.fromisoformat(m[1])
    h, mi, s = int(m[2]), int(m[3]), int(m[4])
    if h > 23 or mi > 59 or s > 60:
        raise ValueError(f"{text!r:.40} has an impossible time of day")
    offset = 0
    if m[6] and m[6] != "Z":
        sign = -1 if m[6][0] == "-" else 1
        digits = m[6][1:].replace(":", "")
        offset = sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    whole = (day.toordinal() - date(1970, 1, 1).toordinal()) * 86400 + h * 3600 + mi * 60 + s - offset
    return whole, float(m[5]) if m[5] else 0.0


def _header(path: Path, lines: Iterator[tuple[int, bytes]]) -> dict[str, int]:
    for number, raw in lines:
        names = [c.strip().strip('"') for c in decode(path, number, raw).rstrip("\r\n").split(",")]
        for c in COLUMNS:
            if c not in names:
                raise TraceFormatError(path, number, c, "missing column in the CSV header")
        return {c: names.index(c) for c in COLUMNS}
    return {}


def iter_requests(path: Path, skips: Skips) -> Iterator[Request]:
    lines = numbered_lines(path)
    columns = _header(path, lines)  # a bad header is never skipped: nothing after it could be read
    start: tuple[int, float] | None = None

    def parse(number: int, raw: bytes, rid: int) -> Request:
        nonlocal start
        cells = [c.strip().strip('"') for c in decode(path, number, raw).rstrip("\r\n").split(",")]
        values = {}
        for c, i in columns.items():
            if i >= len(cells) or not cells[i]:
                raise TraceFormatError(path, number, c, "missing")
            values[c] = cells[i]
        try:
            whole, frac = parse_time(values["TIMESTAMP"])
        except ValueError as e:
            raise TraceFormatError(path, number, "TIMESTAMP", str(e)) from None
        lengths = [_count(path, number, c, values[c]) for c in ("ContextTokens", "GeneratedTokens")]
        arrival = 0.0 if start is None else (whole - start[0]) + (frac - start[1])
        if arrival < 0:
            raise TraceFormatError(path, number, "TIMESTAMP", f"goes backwards ({values['TIMESTAMP']} is before "
                                                              "the first row)")
        req = build(path, number, NAMES, rid=rid, arrival_s=arrival, input_len=lengths[0], output_len=lengths[1])
        if start is None:
            start = (whole, frac)
        return req

    return in_order(path, lines, parse, skips, "TIMESTAMP")


def _count(path: Path, number: int, column: str, cell: str) -> int:
    if not (cell.isascii() and cell.isdigit() and len(cell) <= 18):
        raise TraceFormatError(path, number, column, f"must be a whole number of tokens, got {cell!r:.40}")
    return int(cell)
