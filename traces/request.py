"""One request of a trace, and the deterministic expansion of its prefix identity into token ids.

Token-id encoding (traces/README.md has the full rules):
- token ``i`` of segment ``s`` is ``s * 2**20 + i``; a segment holds at most 2**20 tokens, so a shorter
  occurrence of a segment is a prefix of a longer one;
- trace segment ids lie in ``[0, 2**42)`` (``fold_segment_id`` maps other raw hashes into that range);
- a request without prefix identity gets the private prompt segment ``2**42 + 2*rid``, and an output without
  ``output_segment`` the private segment ``2**42 + 2*rid + 1``: they never equal a trace segment, and every
  token id stays below 2**63;
- explicit ``token_ids`` are real vocabulary ids, used as they are (below 2**62, under every private id).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from poolsim.traces.errors import RequestError

SEGMENT_BITS = 20
MAX_SEGMENT_LEN = 1 << SEGMENT_BITS  # tokens in one segment
NUM_SEGMENT_IDS = 1 << 42  # trace segment ids lie in [0, NUM_SEGMENT_IDS)
PRIVATE_BASE = 1 << 42  # private segment ids: PRIVATE_BASE + 2*rid (prompt), + 1 (output)
MAX_RID = 1 << 41  # keeps every private token id below 2**63
MAX_TOKEN_ID = 1 << 62  # explicit token ids stay below the first private token id
MAX_ARRIVAL_S = 365 * 86400  # s: a year after the trace start; later is a unit or epoch-time mistake
_MASK64 = (1 << 64) - 1


def fold_segment_id(raw: int) -> int:
    """A raw block hash as a segment id: values in [0, 2**42) as they are, others mixed (splitmix64) into it."""
    if 0 <= raw < NUM_SEGMENT_IDS:
        return raw
    x = raw & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return x >> 22  # the top 42 bits


_OFFSETS = np.arange(4096, dtype=np.int64)  # 0..4095 built once: a 512-token block's offsets, an output's ids
_OFFSETS.flags.writeable = False


def _offsets(n: int) -> np.ndarray:
    return _OFFSETS[:n] if n <= len(_OFFSETS) else np.arange(n, dtype=np.int64)


def segment_tokens(segments, tail: tuple[int, int] | None = None) -> np.ndarray:
    """Token ids of a run-length prompt: ``((s, n), ...)`` -> ``s * 2**20 + [0, n)`` for each pair, concatenated;
    ``tail=(s, n)`` appends one more segment (a request's generated ids) in the same pass."""
    nseg = len(segments)
    if nseg > 1:
        block, last = segments[0][1], segments[-1][1]
        if last <= block and all(n == block for _, n in segments[1:-1]):
            # equal blocks and a shorter tail (Mooncake's 512-token hash blocks): one broadcast add writes every id
            # once (repeat + arange + add pass over the prompt three times); the same ids. The checks run on the
            # tuples: a numpy array of a few dozen pairs costs more to build than the checks.
            total = block * (nseg - 1) + last
            extra = tail[1] if tail is not None else 0
            out = np.empty(max(nseg * block, total + extra), dtype=np.int64)
            np.add(np.array([seg << SEGMENT_BITS for seg, _ in segments], dtype=np.int64)[:, None], _offsets(block),
                   out=out[: nseg * block].reshape(nseg, block))
            if extra:  # written after the grid: it overwrites the last block's unused columns
                np.add(tail[0] << SEGMENT_BITS, _offsets(extra), out=out[total: total + extra])  # type: ignore[index]
            return out[: total + extra]
    arr = np.asarray(segments, dtype=np.int64).reshape(-1, 2)
    if tail is not None and tail[1]:
        arr = np.concatenate([arr, np.array([tail], dtype=np.int64)])
    ids, lens = arr[:, 0], arr[:, 1]
    ends = np.cumsum(lens)
    total = int(ends[-1]) if len(ends) else 0
    # token i of the prompt in segment s starting at position p: s * 2**20 + (i - p); one repeat, one add
    out = np.repeat((ids << SEGMENT_BITS) - (ends - lens), lens)
    out += np.arange(total, dtype=np.int64)
    return out


def _plain_segments_total(segments: tuple) -> int | None:
    """The lengths' sum when every pair is a tuple of two plain ints in range, else None (a quick check)."""
    total = 0
    for pair in segments:
        if type(pair) is not tuple or len(pair) != 2:
            return None
        seg, n = pair
        if type(seg) is not int or type(n) is not int or not (0 <= seg < NUM_SEGMENT_IDS
                                                               and 1 <= n <= MAX_SEGMENT_LEN):
            return None
        total += n
    return total


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


@dataclass(slots=True, eq=False)
class Request:
    rid: int  # position in the trace after a stable sort by arrival
    arrival_s: float
    input_len: int
    output_len: int  # where generation stops (EOS or the limit)
    max_new_tokens: int | None = None  # what the client asked for; None when the trace does not say
    ignore_eos: bool = False
    session_id: str | None = None
    turn: int | None = None
    namespace: str | None = None  # the radix cache's extra_key: namespaces never share prefixes
    segments: tuple[tuple[int, int], ...] | None = None
    token_ids: np.ndarray | None = None
    output_segment: int | None = None

    def __post_init__(self) -> None:
        if self.token_ids is not None:
            try:
                ids = np.array(self.token_ids, dtype=np.int64)  # a private, read-only copy
            except (OverflowError, TypeError, ValueError):
                raise RequestError("token_ids", "must be integers in [0, 2**62)") from None
            ids.flags.writeable = False
            self.token_ids = ids
        problem = self._problem()
        if problem is not None:
            raise RequestError(*problem)

    def _problem(self) -> tuple[str, str] | None:
        if not _is_int(self.rid) or not 0 <= self.rid < MAX_RID:
            return "rid", f"must be an integer in [0, 2**41), got {self.rid!r}"
        if not isinstance(self.arrival_s, (int, float)) or not math.isfinite(self.arrival_s) or self.arrival_s < 0:
            return "arrival_s", f"must be a finite number >= 0, got {self.arrival_s!r}"
        if self.arrival_s > MAX_ARRIVAL_S:
            return "arrival_s", (f"arrives {self.arrival_s:.4g} s after the trace start, more than a year "
                                 "(times must be relative to the trace start, in the format's unit)")
        if not _is_int(self.input_len) or self.input_len < 1:
            return "input_len", f"must be an integer >= 1, got {self.input_len!r}"
        if not _is_int(self.output_len) or not 1 <= self.output_len <= MAX_SEGMENT_LEN:
            return "output_len", f"must be an integer in [1, 2**20], got {self.output_len!r}"
        if self.max_new_tokens is not None:
            if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
                return "max_new_tokens", f"must be an integer >= 1 or None, got {self.max_new_tokens!r}"
            if self.output_len > self.max_new_tokens:
                return "output_len", f"{self.output_len} exceeds max_new_tokens {self.max_new_tokens}"
        if self.turn is not None and (not _is_int(self.turn) or self.turn < 0):
            return "turn", f"must be an integer >= 0 or None, got {self.turn!r}"
        for name in ("session_id", "namespace"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                return name, f"must be a string or None, got {getattr(self, name)!r}"
        if self.output_segment is not None:
            if not _is_int(self.output_segment) or not 0 <= self.output_segment < NUM_SEGMENT_IDS:
                return "output_segment", f"must be an integer in [0, 2**42) or None, got {self.output_segment!r}"
            if self.token_ids is not None:
                return "output_segment", "is a segment id, which a token_ids request cannot have"
        if self.segments is not None and self.token_ids is not None:
            return "segments", "a request has segments or token_ids, not both"
        if self.segments is not None:
            return self._segments_problem()
        if self.token_ids is not None:
            ids = self.token_ids
            if ids.ndim != 1 or len(ids) != self.input_len:
                return "token_ids", f"must hold input_len={self.input_len} ids, got shape {ids.shape}"
            if ids.min() < 0 or ids.max() >= MAX_TOKEN_ID:
                return "token_ids", "ids must lie in [0, 2**62)"
            return None
        if self.input_len > MAX_SEGMENT_LEN:
            return "input_len", f"a prompt without prefix identity holds at most 2**20 tokens, got {self.input_len}"
        return None

    def _segments_problem(self) -> tuple[str, str] | None:
        if not isinstance(self.segments, tuple) or not self.segments:
            return "segments", "must be a non-empty tuple of (segment_id, length) pairs"
        if _plain_segments_total(self.segments) == self.input_len:
            return None  # the usual case; anything else is named by the loop below
        total = 0
        for pair in self.segments:
            if not isinstance(pair, tuple) or len(pair) != 2:
                return "segments", f"{pair!r} is not a (segment_id, length) pair"
            seg, n = pair
            if not _is_int(seg) or not 0 <= seg < NUM_SEGMENT_IDS:
                return "segments", f"segment id {seg!r} is outside [0, 2**42)"
            if not _is_int(n) or not 1 <= n <= MAX_SEGMENT_LEN:
                return "segments", f"segment length {n!r} is outside [1, 2**20]"
            total += n
        if total != self.input_len:
            return "segments", f"lengths sum to {total}, not input_len={self.input_len}"
        return None

    def __eq__(self, other) -> bool:
        if not isinstance(other, Request):
            return NotImplemented
        for name in self.__slots__:
            a, b = getattr(self, name), getattr(other, name)
            if name == "token_ids":
                if (a is None) != (b is None) or (a is not None and not np.array_equal(a, b)):
                    return False
            elif a != b:
                return False
        return True

    __hash__ = None  # mutable record

    @property
    def prompt_segment(self) -> int:
        return PRIVATE_BASE + 2 * self.rid

    @property
    def generated_segment(self) -> int:
        """The segment the generated tokens come from: ``output_segment``, or this request's private one."""
        return self.output_segment if self.output_segment is not None else PRIVATE_BASE + 2 * self.rid + 1

    def prompt_tokens(self) -> np.ndarray:
        """The ``input_len`` prompt token ids (int64, read-only when explicit)."""
        if self.token_ids is not None:
            return self.token_ids
        if self.segments is not None:
            return segment_tokens(self.segments)
        return segment_tokens(((self.prompt_segment, self.input_len),))

    def tokens_with_output(self, n: int) -> np.ndarray:
        """``prompt_tokens()`` followed by ``output_tokens(n)`` in one array, the prompt's ids written once."""
        if not 0 <= n <= MAX_SEGMENT_LEN:
            raise ValueError(f"n must lie in [0, 2**20], got {n}")
        if self.token_ids is not None:
            return np.concatenate([self.token_ids, self.output_tokens(n)])
        segments = self.segments if self.segments is not None else ((self.prompt_segment, self.input_len),)
        return segment_tokens(segments, (self.generated_segment, n))

    def output_tokens(self, n: int) -> np.ndarray:
        """The ids of the first ``n`` generated tokens."""
        if not 0 <= n <= MAX_SEGMENT_LEN:
            raise ValueError(f"n must lie in [0, 2**20], got {n}")
        return (np.int64(self.generated_segment) << SEGMENT_BITS) + np.arange(n, dtype=np.int64)
