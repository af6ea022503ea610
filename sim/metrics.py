"""The recorder: plain tuples on the hot path, pandas frames once at the end (definitions in reports/METRICS.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd

STEP_COLUMNS = (
    "step", "replica", "time_s", "duration_s", "kind", "batch_size", "running", "waiting",
    "prefill_tokens", "cached_prefill_tokens", "decode_tokens", "available_size", "evictable_size",
    "protected_size", "free_req_rows", "mamba_free_slots", "mamba_evictable_states", "swa_available_size",
    "swa_evictable_size", "swa_protected_size", "retracted", "aborted",
    "evicted_tokens", "new_token_ratio", "partial_page_tokens", "row_tokens",
    "waiting_scheduled", "running_scheduled", "available_size_scheduled",
)

REQUEST_COLUMNS = (
    "rid", "replica", "arrival_s", "input_len", "output_len", "max_new_tokens", "admission_steps",
    "first_token_step", "finish_step", "first_token_s", "finish_s", "cached_tokens", "cached_tokens_first",
    "retraction_count", "aborted", "finished_reason", "tokens_not_cached", "abort_cause",
)


class Recorder:
    def __init__(self):
        self.steps: list[tuple] = []
        self.requests: list[tuple] = []
        self.on_done = None  # called with each finished or aborted request (the engine's client releases it)

    def on_step(self, row: tuple) -> None:
        self.steps.append(row)

    def on_finish(self, req) -> None:
        self.requests.append((
            req.rid, req.replica, req.arrival_s, int(req.trace_req.input_len), req.num_output, req.max_new_tokens,
            " ".join(map(str, req.admission_steps)), req.first_token_step, req.finish_step,
            req.first_token_time, req.finish_time, " ".join(map(str, req.cached_tokens)),
            req.cached_tokens[0] if req.cached_tokens else 0, req.retraction_count, req.aborted,
            req.finished_reason, req.tokens_not_cached, req.abort_cause or "",
        ))
        if self.on_done is not None:
            self.on_done(req)

    def step_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.steps, columns=list(STEP_COLUMNS))

    def request_frame(self) -> pd.DataFrame:
        df = pd.DataFrame(self.requests, columns=list(REQUEST_COLUMNS)).sort_values("rid", kind="stable")
        df["ttft_s"] = df["first_token_s"] - df["arrival_s"]
        df["e2e_s"] = df["finish_s"] - df["arrival_s"]
        decoded = (df["output_len"] - 1).where(df["output_len"] > 1)
        df["itl_s"] = (df["finish_s"] - df["first_token_s"]) / decoded
        return df.reset_index(drop=True)


def percentiles(series: pd.Series, qs=(50, 90, 99)) -> dict:
    s = series.dropna()
    if s.empty:
        return {f"p{q}": None for q in qs}
    return {f"p{q}": float(np.percentile(s, q)) for q in qs}
