"""One measured forward pass, as the step-time model reads it: the batch's composition in aggregates, and seconds.

Forward-pass metrics and decode log lines give aggregates, not per-request lengths, so a ``MeasuredStep`` hands
``AnalyticStepTime.time_of`` its arguments directly (``time_args``; ``kernels.calibrate.predict`` uses them) instead
of rebuilding a batch. Only the causal prefill pair count needs more than the aggregates give (``prefill_pairs``).
"""

from __future__ import annotations

KINDS = ("prefill", "decode", "mixed")
# ``MeasuredStep.to_row``'s keys: the columns of the steps.csv that calibrate --measured and validate --measured write
ROW_COLUMNS = ("source", "file", "line", "timestamp", "rank", "kind", "num_prefill_reqs", "prefill_tokens",
               "prefill_prefix_tokens", "num_decode_reqs", "decode_kv_tokens", "cuda_graph", "measured_s", "marks")


def prefill_pairs(num_reqs: int, new_tokens: int, prefix_tokens: int, length_var: float) -> float:
    """Causal attention pairs of a prefill, sum over requests of ``e p + e (e + 1) / 2`` (e new, p prefix tokens),
    from aggregates. Exact for one request. For several, ``sum e**2`` is taken as ``E**2 / n + n var`` with ``var``
    the variance of the requests' prompt lengths (ForwardPassMetrics ``var_prefill_length``: exact for a batch of
    whole uncached prompts), at most ``E**2`` (one request holding all), and ``sum e p`` as ``E P / n`` (an equal
    split)."""
    n, e, p = num_reqs, new_tokens, prefix_tokens
    if n <= 0 or e <= 0:
        return 0.0
    if n == 1:
        return e * p + e * (e + 1) / 2
    sum_e2 = min(e * e / n + n * max(length_var, 0.0), float(e * e))
    return e * p / n + (sum_e2 + e) / 2


class MeasuredStep:
    """A step's composition (what the server measured it on) and its measured time. ``marks``: why this step's time
    is not one clean forward pass of this composition (empty: usable); a marked step is reported, never fitted."""

    __slots__ = ("source", "path", "line", "timestamp", "rank", "num_prefill_reqs", "prefill_tokens",
                 "prefill_prefix_tokens", "prefill_len_var", "num_decode_reqs", "decode_kv_tokens", "measured_s",
                 "marks", "cuda_graph", "queued_reqs", "time_args")

    def __init__(self, source: str, path: str, line: int, *, timestamp: float | None, rank: str,
                 num_prefill_reqs: int = 0, prefill_tokens: int = 0, prefill_prefix_tokens: int = 0,
                 prefill_len_var: float = 0.0, num_decode_reqs: int = 0, decode_kv_tokens: float = 0,
                 measured_s: float, marks: tuple[str, ...] = (), cuda_graph: bool | None = None,
                 queued_reqs: int | None = None):
        self.source, self.path, self.line, self.timestamp, self.rank = source, path, line, timestamp, rank
        self.num_prefill_reqs, self.prefill_tokens = num_prefill_reqs, prefill_tokens
        self.prefill_prefix_tokens, self.prefill_len_var = prefill_prefix_tokens, prefill_len_var
        self.num_decode_reqs, self.decode_kv_tokens = num_decode_reqs, decode_kv_tokens
        self.measured_s, self.marks, self.cuda_graph, self.queued_reqs = measured_s, marks, cuda_graph, queued_reqs
        # ``AnalyticStepTime.time_of``'s arguments: prefill tokens, decode tokens, prefill pairs, decode pairs (the
        # decode rows' KV tokens), context tokens, requests
        self.time_args = self._time_args()

    @property
    def kind(self) -> str:
        if self.num_prefill_reqs and self.num_decode_reqs:
            return "mixed"
        return "prefill" if self.num_prefill_reqs else "decode"

    def _time_args(self) -> tuple[int, ...]:
        # ints: time_of is typed int and compiled by mypyc in a built install
        e, p, d = self.prefill_tokens, self.prefill_prefix_tokens, self.num_decode_reqs
        pairs = round(prefill_pairs(self.num_prefill_reqs, e, p, self.prefill_len_var))
        kv = round(self.decode_kv_tokens)
        return (e, d, pairs, kv, p + e + kv, self.num_prefill_reqs + d)

    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def to_row(self) -> dict:
        """One table row, keyed by ``ROW_COLUMNS``."""
        return dict(zip(ROW_COLUMNS, (
            self.source, self.path, self.line, self.timestamp, self.rank, self.kind, self.num_prefill_reqs,
            self.prefill_tokens, self.prefill_prefix_tokens, self.num_decode_reqs, self.decode_kv_tokens,
            self.cuda_graph, self.measured_s, ";".join(self.marks))))


class StepSource:
    """The steps one file gave, in file order, what it skipped (``Skips``), and facts about the file (``notes``)."""

    def __init__(self, path: str, format: str, steps: list[MeasuredStep], skips, notes: dict | None = None):
        self.path, self.format, self.steps, self.skips, self.notes = path, format, steps, skips, notes or {}

    def usable(self) -> list[MeasuredStep]:
        return [s for s in self.steps if not s.marks]
