"""Mooncake JSONL (FAST'25): ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``.

``hash_ids`` holds one id per 512-token block, the last block partial; equal ids mean equal blocks with equal
prefixes (the ids are chained). Block ``j`` becomes the segment ``(hash_ids[j], 512)``, the last one
``(hash_ids[-1], input_length - 512 * (len(hash_ids) - 1))``. Timestamps must not go backwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import repeat
from pathlib import Path

from poolsim.traces.lines import Fields, Skips, build, in_order, json_object, numbered_lines
from poolsim.traces.request import NUM_SEGMENT_IDS, Request, fold_segment_id

FORMAT = "mooncake"
BLOCK_SIZE = 512  # tokens per hash_ids entry
NAMES = {"arrival_s": "timestamp", "input_len": "input_length", "output_len": "output_length",
         "segments": "hash_ids"}


def looks_like(first: dict) -> bool:
    return "hash_ids" in first or "input_length" in first


def block_segments(hash_ids: list[int], input_len: int) -> tuple[tuple[int, int], ...]:
    last = input_len - BLOCK_SIZE * (len(hash_ids) - 1)
    if 0 <= min(hash_ids) and max(hash_ids) < NUM_SEGMENT_IDS:  # the usual case: pairs built at C speed
        segs = list(zip(hash_ids, repeat(BLOCK_SIZE)))
    else:
        segs = [(h if 0 <= h < NUM_SEGMENT_IDS else fold_segment_id(h), BLOCK_SIZE) for h in hash_ids]
    segs[-1] = (segs[-1][0], last)
    return tuple(segs)


def iter_requests(path: Path, skips: Skips) -> Iterator[Request]:
    def parse(number: int, raw: bytes, rid: int) -> Request:
        f = Fields(path, number, json_object(path, number, raw))
        timestamp_ms = f.number("timestamp")
        input_len = f.integer("input_length", lo=1)
        output_len = f.integer("output_length", lo=1)
        hash_ids = f.integers("hash_ids")
        blocks = -(-input_len // BLOCK_SIZE)
        if len(hash_ids) != blocks:
            raise f.error("hash_ids", f"has {len(hash_ids)} ids, but input_length {input_len} needs "
                                      f"ceil({input_len}/{BLOCK_SIZE}) = {blocks}")
        return build(path, number, NAMES, rid=rid, arrival_s=timestamp_ms / 1000.0, input_len=input_len,
                     output_len=output_len, segments=block_segments(hash_ids, input_len))

    return in_order(path, numbered_lines(path), parse, skips, "timestamp")
