"""``poolsim trace inspect``: size, rate, length percentiles and prefix sharing with an unbounded cache.

Prefix sharing (traces/README.md): the cache holds every earlier request's prompt followed by its generated
tokens. ``L_r`` is the longest prefix of request ``r``'s prompt equal to a prefix of some earlier (by arrival)
request's sequence in the same namespace, at most ``input_len``.
- token granularity: ``sum_r L_r / sum_r input_len``;
- block granularity (block size B): prompt ``r`` has ``ceil(input_len / B)`` blocks; block ``j`` is shared when
  the prompt's first ``min((j+1) B, input_len)`` tokens are all within ``L_r``; the ratio is shared blocks over
  all blocks (a partial last block counts when the whole prompt is shared, as a Mooncake hash would match).
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass

import numpy as np

from poolsim.traces.request import Request
from poolsim.traces.trace import Trace

PERCENTILES = (50, 90, 99)


class PrefixIndex:
    """Every request's prompt + output seen so far, matched a segment (or, for token_ids, a sequence) at a time.

    Segments form a trie keyed ``(node, segment id, length)``; a shorter occurrence of a segment is a prefix of
    a longer one, so a segment matches ``min(length, longest seen at that node)`` tokens when no child has its
    exact length. Explicit token ids are kept as a sorted list of byte strings: the longest common prefix with
    any earlier sequence is the one with a lexicographic neighbour.
    """

    def __init__(self):
        self._roots: dict[str | None, int] = {}
        self._longest: dict[tuple[int, int], int] = {}
        self._child: dict[tuple[int, int, int], int] = {}
        self._sorted: dict[str | None, list[bytes]] = {}

    def match_and_insert(self, r: Request) -> int:
        """``L_r``: tokens of ``r``'s prompt shared with an earlier sequence; then ``r`` joins the cache."""
        if r.token_ids is not None:
            return self._tokens(r)
        if r.segments is None:
            return 0  # a private prompt shares nothing, and nothing later can share it
        root = self._roots.setdefault(r.namespace, len(self._roots))  # roots >= 0, other nodes < 0
        matched = self._match(root, r.segments)
        seq = r.segments if r.output_segment is None else r.segments + ((r.output_segment, r.output_len),)
        self._insert(root, seq)
        return min(matched, r.input_len)

    def _match(self, node: int, segments) -> int:
        matched = 0
        for seg, n in segments:
            longest = self._longest.get((node, seg))
            if longest is None:
                break
            child = self._child.get((node, seg, n))
            if child is None:
                return matched + min(n, longest)
            matched += n
            node = child
        return matched

    def _insert(self, node: int, segments) -> None:
        for seg, n in segments:
            if self._longest.get((node, seg), 0) < n:
                self._longest[(node, seg)] = n
            key = (node, seg, n)
            child = self._child.get(key)
            if child is None:
                child = self._child[key] = -1 - len(self._child)
            node = child

    def _tokens(self, r: Request) -> int:
        key = r.token_ids.astype(">i8").tobytes()  # big-endian: byte order is token order
        seqs = self._sorted.setdefault(r.namespace, [])
        i = bisect.bisect_left(seqs, key)
        best = max((_common_tokens(key, seqs[j]) for j in (i - 1, i) if 0 <= j < len(seqs)), default=0)
        seqs.insert(i, key)
        return best


def _common_tokens(a: bytes, b: bytes) -> int:
    x, y = np.frombuffer(a, ">i8"), np.frombuffer(b, ">i8")
    m = min(len(x), len(y))
    diff = np.flatnonzero(x[:m] != y[:m])
    return int(diff[0]) if len(diff) else m


def shared_prefix_lengths(trace: Trace) -> np.ndarray:
    """``L_r`` for every request, in trace order."""
    index = PrefixIndex()
    return np.fromiter((index.match_and_insert(r) for r in trace), dtype=np.int64)


def shared_blocks(shared: np.ndarray, input_lens: np.ndarray, block_size: int) -> tuple[int, int]:
    """(shared blocks, all blocks) at block granularity, from ``L_r`` and the prompt lengths."""
    blocks = -(-input_lens // block_size)
    whole = (shared == input_lens) & (input_lens % block_size != 0)
    return int((shared // block_size + whole).sum()), int(blocks.sum())


@dataclass(frozen=True)
class TraceStats:
    name: str
    format: str
    requests: int
    skipped_lines: int
    sessions: int  # distinct session ids
    duration_s: float  # last arrival - first arrival
    rate_per_s: float | None  # requests / duration_s; None for a zero duration
    input_len: dict[str, float]  # mean, p50, p90, p99, max
    output_len: dict[str, float]
    prompt_tokens: int
    shared_tokens: int
    token_sharing: float | None
    block_size: int
    blocks: int
    shared_blocks: int
    block_sharing: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def _summary(x: np.ndarray) -> dict[str, float]:
    if len(x) == 0:
        return {}
    out = {"mean": float(x.mean())}
    out.update({f"p{q}": float(v) for q, v in zip(PERCENTILES, np.percentile(x, PERCENTILES))})
    out["max"] = float(x.max())
    return out


def inspect_trace(trace: Trace, block_size: int = 512) -> TraceStats:
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    index = PrefixIndex()
    arrivals, inputs, outputs, shared, sessions = [], [], [], [], set()
    for r in trace:
        arrivals.append(r.arrival_s)
        inputs.append(r.input_len)
        outputs.append(r.output_len)
        shared.append(index.match_and_insert(r))
        if r.session_id is not None:
            sessions.add(r.session_id)
    inputs_a, shared_a = np.array(inputs, dtype=np.int64), np.array(shared, dtype=np.int64)
    duration = arrivals[-1] - arrivals[0] if arrivals else 0.0
    hit_blocks, blocks = shared_blocks(shared_a, inputs_a, block_size)
    prompt_tokens = int(inputs_a.sum())
    return TraceStats(
        name=trace.name, format=trace.format, requests=len(arrivals), skipped_lines=trace.skipped_lines,
        sessions=len(sessions), duration_s=duration, rate_per_s=len(arrivals) / duration if duration > 0 else None,
        input_len=_summary(inputs_a), output_len=_summary(np.array(outputs, dtype=np.int64)),
        prompt_tokens=prompt_tokens, shared_tokens=int(shared_a.sum()),
        token_sharing=int(shared_a.sum()) / prompt_tokens if prompt_tokens else None,
        block_size=block_size, blocks=blocks, shared_blocks=hit_blocks,
        block_sharing=hit_blocks / blocks if blocks else None)


def mean_rate(trace: Trace) -> float:
    """Requests per second over the trace's span (what ``trace scale --rate`` aims at)."""
    first = last = None
    n = 0
    for r in trace:
        first = r.arrival_s if first is None else first
        last = r.arrival_s
        n += 1
    if n < 2 or last == first:
        raise ValueError("the rate of a trace needs two requests at different times")
    return n / (last - first)
