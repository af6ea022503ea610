"""JSONL with explicit token ids: ``arrival_s`` (s), ``token_ids`` (the prompt's vocabulary ids), ``output_len``.

Optional: ``max_new_tokens``, ``ignore_eos``, ``session_id``, ``turn``, ``namespace``. Lines are in arrival order.
The ids are used as they are (they must lie in [0, 2**62)); generated tokens get the request's private segment.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from poolsim.traces.lines import Fields, Skips, build, in_order, json_object, numbered_lines
from poolsim.traces.poolsim_format import optional_fields
from poolsim.traces.request import Request

FORMAT = "tokens"
NAMES = {"input_len": "token_ids"}


def looks_like(first: dict) -> bool:
    return "token_ids" in first and "input_len" not in first


def iter_requests(path: Path, skips: Skips) -> Iterator[Request]:
    def parse(number: int, raw: bytes, rid: int) -> Request:
        f = Fields(path, number, json_object(path, number, raw))
        token_ids = f.integers("token_ids")
        if not token_ids:
            raise f.error("token_ids", "is empty; a prompt needs at least one token")
        return build(path, number, NAMES, rid=rid, arrival_s=f.number("arrival_s"), input_len=len(token_ids),
                     output_len=f.integer("output_len", lo=1), token_ids=token_ids, **optional_fields(f))

    return in_order(path, numbered_lines(path), parse, skips, "arrival_s")
