"""Shared by the line-based loaders: numbered lines, JSON objects, typed fields, skipping and ordering."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path

from poolsim.traces.errors import RequestError, TraceFormatError
from poolsim.traces.request import Request


def json_kind(value) -> str:
    """What a JSON value is, in JSON's words (an error says "got null", not "got NoneType")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__)


class Skips:
    """Whether bad lines may be skipped, and how many were."""

    def __init__(self, allowed: bool):
        self.allowed = allowed
        self.count = 0


BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, which some editors write first; it is not content
HEAD_BYTES = 65536  # the first block: format detection and the binary check read this much


def head(path: Path) -> bytes:
    """The file's first block, without a UTF-8 BOM."""
    with open(path, "rb") as f:
        return f.read(HEAD_BYTES).removeprefix(BOM)


def numbered_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Non-blank lines with their 1-based numbers, as bytes (decoded per line so a bad byte names its line)."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if number == 1:
                raw = raw.removeprefix(BOM)
            if raw.strip():
                yield number, raw


def decode(path: Path, number: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceFormatError(path, number, None, f"not UTF-8 text ({e.reason} at byte {e.start})") from None


def json_object(path: Path, number: int, raw: bytes) -> dict:
    text = decode(path, number, raw)
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise TraceFormatError(path, number, None, f"invalid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise TraceFormatError(path, number, None, f"expected a JSON object, got {json_kind(obj)}")
    return obj


class Fields:
    """Typed access to one record's fields; every failure is a TraceFormatError naming the field."""

    def __init__(self, path: Path, number: int, obj: dict):
        self.path, self.line, self.obj = path, number, obj

    def error(self, field: str | None, problem: str) -> TraceFormatError:
        return TraceFormatError(self.path, self.line, field, problem)

    def has(self, key: str) -> bool:
        return self.obj.get(key) is not None

    def raw(self, key: str, required: bool = True):
        if key not in self.obj or self.obj[key] is None:
            if required:
                raise self.error(key, "missing")
            return None
        return self.obj[key]

    def integer(self, key: str, lo: int | None = 0, required: bool = True) -> int | None:
        v = self.raw(key, required)
        if v is None:
            return None
        v = self.as_int(key, v)
        if lo is not None and v < lo:
            raise self.error(key, f"must be >= {lo}, got {v}")
        return v

    def as_int(self, key: str, v) -> int:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.error(key, f"must be an integer, got {v!r:.40}")
        return v

    def number(self, key: str, lo: float = 0.0) -> float:
        v = self.raw(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise self.error(key, f"must be a number, got {v!r:.40}")
        try:
            v = float(v)
        except OverflowError:
            raise self.error(key, "is too large") from None
        if not math.isfinite(v) or v < lo:
            raise self.error(key, f"must be a finite number >= {lo:g}, got {v!r}")
        return v

    def text(self, key: str, required: bool = False) -> str | None:
        v = self.raw(key, required)
        if v is not None and not isinstance(v, str):
            raise self.error(key, f"must be a string, got {v!r:.40}")
        return v

    def flag(self, key: str, default: bool = False) -> bool:
        v = self.raw(key, required=False)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.error(key, f"must be true or false, got {v!r:.40}")
        return v

    def integers(self, key: str) -> list[int]:
        v = self.raw(key)
        if not isinstance(v, list):
            raise self.error(key, f"must be a list of integers, got {json_kind(v)}")
        if set(map(type, v)) <= {int}:  # the usual case, checked at C speed: every element already an int
            return v
        return [self.as_int(key, x) for x in v]


def build(path: Path, number: int, names: dict[str, str], **kwargs) -> Request:
    """A Request, with its consistency errors renamed to the trace's own field names."""
    try:
        return Request(**kwargs)
    except RequestError as e:
        raise TraceFormatError(path, number, names.get(e.field, e.field), e.problem) from None


def in_order(path: Path, lines: Iterator[tuple[int, bytes]], parse: Callable[[int, bytes, int], Request],
             skips: Skips, time_field: str) -> Iterator[Request]:
    """Requests from ``parse(number, raw, rid)``, numbered in order; timestamps must never go backwards."""
    rid, last = 0, -math.inf
    for number, raw in lines:
        try:
            req = parse(number, raw, rid)
            if req.arrival_s < last:
                raise TraceFormatError(path, number, time_field,
                                       f"goes backwards (arrival {req.arrival_s:g} s after {last:g} s)")
        except TraceFormatError:
            if not skips.allowed:
                raise
            skips.count += 1
            continue
        last = req.arrival_s
        rid += 1
        yield req
