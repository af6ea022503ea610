"""poolsim's own JSONL: one object per request holding every Request field (traces/README.md).

Lines are in arrival order (``arrival_s`` never goes backwards); ``rid`` is written for readers and requests are
renumbered by position on load. A trace uses ``segments`` or ``token_ids``, never both forms.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from poolsim.traces.lines import Fields, Skips, build, in_order, json_object, numbered_lines
from poolsim.traces.request import Request

FORMAT = "poolsim"
FIELDS = ("rid", "arrival_s", "input_len", "output_len", "max_new_tokens", "ignore_eos", "session_id", "turn",
          "namespace", "segments", "token_ids", "output_segment")


def looks_like(first: dict) -> bool:
    return "input_len" in first and "arrival_s" in first


def optional_fields(f: Fields) -> dict:
    """The fields the poolsim and tokens formats share, absent or null meaning the Request default."""
    return dict(max_new_tokens=f.integer("max_new_tokens", lo=1, required=False), ignore_eos=f.flag("ignore_eos"),
                session_id=f.text("session_id"), turn=f.integer("turn", required=False),
                namespace=f.text("namespace"))


def _segments(f: Fields) -> tuple[tuple[int, int], ...] | None:
    v = f.raw("segments", required=False)
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(p, list) and len(p) == 2 for p in v):
        raise f.error("segments", "must be a list of [segment_id, length] pairs")
    return tuple((f.as_int("segments", s), f.as_int("segments", n)) for s, n in v)


def iter_requests(path: Path, skips: Skips) -> Iterator[Request]:
    forms: set[str] = set()

    def parse(number: int, raw: bytes, rid: int) -> Request:
        f = Fields(path, number, json_object(path, number, raw))
        f.integer("rid", required=False)
        token_ids = f.integers("token_ids") if f.has("token_ids") else None
        segments = _segments(f)
        form = "token_ids" if token_ids is not None else "segments" if segments is not None else None
        if form is not None and forms and form not in forms:
            raise f.error(form, f"the trace already uses {next(iter(forms))}; it cannot mix the two forms")
        req = build(path, number, {}, rid=rid, arrival_s=f.number("arrival_s"), input_len=f.integer("input_len"),
                    output_len=f.integer("output_len"), segments=segments, token_ids=token_ids,
                    output_segment=f.integer("output_segment", required=False), **optional_fields(f))
        if form is not None:
            forms.add(form)
        return req

    return in_order(path, numbered_lines(path), parse, skips, "arrival_s")


def to_json(r: Request) -> str:
    obj = {name: getattr(r, name) for name in FIELDS}
    if r.segments is not None:
        obj["segments"] = [[int(s), int(n)] for s, n in r.segments]
    if r.token_ids is not None:
        obj["token_ids"] = r.token_ids.tolist()
    return json.dumps(obj, separators=(",", ":"), default=_plain)


def _plain(x):
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    raise TypeError(f"cannot write {type(x).__name__} to a poolsim trace")


def write_trace(requests: Iterable[Request], path: str | Path) -> int:
    """Write requests (in arrival order) as a poolsim JSONL file; returns how many were written."""
    count = 0
    with open(path, "w", encoding="utf-8") as out:
        for r in requests:
            out.write(to_json(r) + "\n")
            count += 1
    return count
