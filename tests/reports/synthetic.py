"""Large run frames made with numpy (no simulation): for rendering-speed and scale tests."""

import numpy as np
import pandas as pd

from poolsim.reports.summary import summarize
from poolsim.sim.metrics import REQUEST_COLUMNS, STEP_COLUMNS

CAPACITY = 200_000  # KV slots per replica
ROWS = 256  # request rows per replica


def big_run(num_steps: int = 100_000, num_requests: int = 20_000, replicas: int = 2, seed: int = 0):
    """(steps, requests, summary): KV conserved per step (own + protected + evictable + free == CAPACITY)."""
    rng = np.random.default_rng(seed)
    n = num_steps
    replica = np.arange(n) % replicas
    time_s = (np.arange(n) // replicas) * 0.02
    protected = rng.integers(0, CAPACITY // 4, n)
    evictable = rng.integers(0, CAPACITY // 4, n)
    own = rng.integers(0, CAPACITY // 2, n)
    running = rng.integers(1, ROWS, n)
    steps = pd.DataFrame({
        "step": np.arange(n) // replicas, "replica": replica, "time_s": time_s, "duration_s": 0.02,
        "kind": np.where(np.arange(n) % 7 == 0, "extend", "decode"), "batch_size": running, "running": running,
        "waiting": rng.integers(0, 50, n), "prefill_tokens": np.where(np.arange(n) % 7 == 0, 4000, 0),
        "cached_prefill_tokens": np.where(np.arange(n) % 7 == 0, 2500, 0), "decode_tokens": running,
        "available_size": CAPACITY - own - protected - evictable, "evictable_size": evictable,
        "protected_size": protected, "free_req_rows": ROWS - running, "mamba_free_slots": 0,
        "mamba_evictable_states": 0, "swa_available_size": 0, "swa_evictable_size": 0, "swa_protected_size": 0,
        "retracted": (rng.random(n) < 0.01).astype(int), "aborted": 0,
        "evicted_tokens": rng.integers(0, 100, n), "new_token_ratio": 0.5, "partial_page_tokens": running * 31,
        "row_tokens": own, "waiting_scheduled": rng.integers(0, 50, n), "running_scheduled": running,
        "available_size_scheduled": CAPACITY - own - protected - evictable, "mamba_evicted_tokens": 0,
    })[list(STEP_COLUMNS)]
    m = num_requests
    arrival = np.sort(rng.uniform(0, time_s[-1] * 0.9, m))
    ttft = rng.lognormal(-2, 1, m)
    out_len = rng.integers(1, 500, m)
    first = arrival + ttft
    finish = first + (out_len - 1) * rng.uniform(0.015, 0.05, m)
    aborted = rng.random(m) < 0.01
    requests = pd.DataFrame({
        "rid": np.arange(m), "replica": np.arange(m) % replicas, "arrival_s": arrival,
        "input_len": rng.integers(100, 4000, m), "output_len": out_len, "max_new_tokens": out_len,
        "admission_steps": "0", "first_token_step": 0, "finish_step": 0, "first_token_s": first, "finish_s": finish,
        "cached_tokens": "0", "cached_tokens_first": rng.integers(0, 100, m), "retraction_count": 0,
        "aborted": aborted, "finished_reason": np.where(aborted, "abort", "length"),
        "tokens_not_cached": rng.integers(0, 64, m), "abort_cause": np.where(aborted, "input_too_long", ""),
    })[list(REQUEST_COLUMNS)]
    requests["ttft_s"] = requests["first_token_s"] - requests["arrival_s"]
    requests["e2e_s"] = requests["finish_s"] - requests["arrival_s"]
    requests["itl_s"] = (requests["finish_s"] - requests["first_token_s"]) / (requests["output_len"] - 1).where(
        requests["output_len"] > 1)
    summary = summarize(steps, requests, {"max_total_num_tokens": CAPACITY, "max_running_requests": ROWS,
                                          "page_size": 64, "context_len": 8192})
    return steps, requests, summary
