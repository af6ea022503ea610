"""Run summary and the OOM verdict in plain words. Every figure is defined in reports/METRICS.md."""

from __future__ import annotations

import math

import pandas as pd

from poolsim.sim.metrics import percentiles

# The verdict's thresholds (reports/METRICS.md, "The verdict"): a server cannot keep up when the median request
# waits at least MIN_QUEUE_WAIT_S for admission and either waiting is most of its latency or most of the trace is
# still unfinished when the last request arrives.
MIN_QUEUE_WAIT_S = 1.0
MAX_QUEUE_WAIT_SHARE = 0.5
MAX_BACKLOG_FRAC = 0.5
ABORT_CAUSES = ("input_too_long", "decode_out_of_memory", "never_schedulable")
ABORT_CAUSE_WORDS = {
    "input_too_long": "with a prompt too long: at least max_req_input_len = min(context length, KV pool) - 6 tokens",
    "decode_out_of_memory": "with no KV slot for the next token even when running alone",
    "never_schedulable": "never admitted: too large for the empty server",
}
SLO_METRICS = ("e2e", "ttft")
# The step columns summarize reads: a run whose step table is on disk keeps only these (app.run.simulate).
SUMMARY_STEP_COLUMNS = ("step", "replica", "time_s", "duration_s", "waiting", "prefill_tokens",
                        "cached_prefill_tokens", "available_size", "evictable_size",
                        "free_req_rows", "mamba_free_slots", "mamba_evictable_states", "retracted",
                        "evicted_tokens", "partial_page_tokens", "row_tokens", "swa_available_size",
                        "swa_evictable_size", "mamba_evicted_tokens")


def _pool_usage(capacity: int, used: pd.Series, dur: pd.Series, first_exhausted_s) -> dict:
    """One pool's entry in ``pools``: capacity, peak and time-weighted mean used fraction, first exhaustion."""
    return {"capacity": capacity,
            "peak_used_frac": float(used.max()) if len(used) else 0.0,
            "mean_used_frac": _time_weighted_mean(used, dur) if len(used) else 0.0,
            "first_exhausted_s": first_exhausted_s}


def _time_weighted_mean(values: pd.Series, durations: pd.Series) -> float:
    total = float(durations.sum())
    return float((values * durations).sum() / total) if total > 0 else 0.0


def _first_time(steps: pd.DataFrame, mask: pd.Series) -> float | None:
    hit = steps.loc[mask, "time_s"]
    return float(hit.iloc[0]) if len(hit) else None


def _queue_waits(steps: pd.DataFrame, requests: pd.DataFrame) -> pd.Series:
    """Arrival to the start of the step that first admitted the request (NaN if never admitted)."""
    first = requests["admission_steps"].astype(str).str.split(" ").str[0]
    step = pd.to_numeric(first, errors="coerce")
    if not len(steps):
        return pd.Series(float("nan"), index=requests.index)
    start = steps.set_index(["replica", "step"])["time_s"]
    keys = pd.MultiIndex.from_arrays([requests["replica"], step.fillna(-1).astype(int)])
    admitted = pd.Series(start.reindex(keys).to_numpy(), index=requests.index)
    return admitted - requests["arrival_s"]


SPECULATIVE_KEYS = ("speculative_algorithm", "speculative_accept_length_source", "speculative_accept_length_expected",
                    "speculative_accept_length", "speculative_accept_rate", "speculative_tokens_per_step",
                    "speculative_verify_steps", "speculative_decode_steps", "speculative_accepted_tokens",
                    "speculative_accepted_drafts_histogram", "speculative_draft_overhead", "speculative_draft_s",
                    "speculative_verify_s")


def summarize(steps: pd.DataFrame, requests: pd.DataFrame, meta: dict) -> dict:
    """``meta``: per-replica capacities: ``max_total_num_tokens``, ``max_running_requests``,
    ``max_mamba_cache_size`` (0 if none), ``page_size``, ``context_len``, ``dp_size``; optionally
    ``retraction_events``, the SLO (``slo_p99_s``, ``slo_on``: e2e or ttft) and ``speculative`` (the
    ``speculative_*`` keys, sim/speculative.py spec_summary)."""
    cap_kv = meta["max_total_num_tokens"]
    cap_rows = meta["max_running_requests"]
    cap_mamba = meta.get("max_mamba_cache_size") or 0
    done = requests[~requests["aborted"]]
    first_arrival = float(requests["arrival_s"].min()) if len(requests) else 0.0
    last_finish = float(requests["finish_s"].max()) if len(requests) else 0.0
    duration = max(last_finish - first_arrival, 0.0)
    out_tokens = int(done["output_len"].sum())
    in_tokens = int(done["input_len"].sum())

    kv_used = (cap_kv - steps["available_size"] - steps["evictable_size"]) / cap_kv if len(steps) else pd.Series(dtype=float)
    rows_used = (cap_rows - steps["free_req_rows"]) / cap_rows if len(steps) else pd.Series(dtype=float)
    dur = steps["duration_s"] if len(steps) else pd.Series(dtype=float)
    prefill = int(steps["prefill_tokens"].sum()) if len(steps) else 0
    cached = int(steps["cached_prefill_tokens"].sum()) if len(steps) else 0

    events = sorted(meta.get("retraction_events", []))
    cap_swa = meta.get("swa_max_total_num_tokens") or 0
    if cap_swa:  # two pools: a retraction counts against the one that ran short (its event says which)
        kv_short = _first_time(steps, steps["available_size"] + steps["evictable_size"] < meta["page_size"]) \
            if len(steps) else None
        kv_exhausted = _earliest(kv_short, _first_event(events, "kv"))
    else:
        kv_exhausted = _first_time(steps, (steps["retracted"] > 0) | (
            steps["available_size"] + steps["evictable_size"] < meta["page_size"])) if len(steps) else None
    pools = {
        "kv": _pool_usage(cap_kv, kv_used, dur, kv_exhausted),
        "rows": _pool_usage(cap_rows, rows_used, dur,
                            _first_time(steps, steps["free_req_rows"] == 0) if len(steps) else None),
    }
    if cap_mamba:
        mamba_used = (cap_mamba - steps["mamba_free_slots"] - steps["mamba_evictable_states"]) / cap_mamba
        pools["mamba"] = _pool_usage(
            cap_mamba, mamba_used, dur,
            _first_time(steps, steps["mamba_free_slots"] + steps["mamba_evictable_states"] == 0)
            if len(steps) else None)
        pools["mamba"]["mean_idle_slots"] = _time_weighted_mean(steps["mamba_free_slots"], dur) if len(steps) else 0.0
    if cap_swa:
        swa_used = (cap_swa - steps["swa_available_size"] - steps["swa_evictable_size"]) / cap_swa
        pools["swa"] = _pool_usage(cap_swa, swa_used, dur, _earliest(
            _first_time(steps, steps["swa_available_size"] + steps["swa_evictable_size"] < meta["page_size"])
            if len(steps) else None, _first_event(events, "swa")))
    exhausted = [(p["first_exhausted_s"], name) for name, p in pools.items() if p["first_exhausted_s"] is not None]
    if exhausted:
        binding = min(exhausted)[1]
    else:
        binding = max(pools, key=lambda n: pools[n]["peak_used_frac"]) if len(steps) else None

    row_bytes = (cap_rows + 1) * meta["context_len"] * 4
    summary = {
        "requests": int(len(requests)),
        "finished": int(len(done)),
        "aborted": int(requests["aborted"].sum()),
        "retracted_requests": int((requests["retraction_count"] > 0).sum()),
        "retractions": int(requests["retraction_count"].sum()),
        "steps": int(len(steps)),
        "peak_waiting": int(steps["waiting"].max()) if len(steps) else 0,
        "duration_s": duration,
        "throughput_req_s": len(done) / duration if duration > 0 else 0.0,
        "input_tok_s": in_tokens / duration if duration > 0 else 0.0,
        "output_tok_s": out_tokens / duration if duration > 0 else 0.0,
        "ttft_s": {**percentiles(done["ttft_s"]), "mean": _mean(done["ttft_s"])},
        "itl_s": {**percentiles(done["itl_s"]), "mean": _mean(done["itl_s"])},
        "e2e_s": {**percentiles(done["e2e_s"]), "mean": _mean(done["e2e_s"])},
        "cache_hit_rate": cached / (cached + prefill) if cached + prefill else 0.0,
        "prefill_tokens": prefill,
        "cached_prefill_tokens": cached,
        "evicted_tokens": int(steps["evicted_tokens"].sum()) if len(steps) else 0,
        "pools": pools,
        "binding_pool": binding,
        "fragmentation": {
            "mean_partial_page_tokens": _time_weighted_mean(steps["partial_page_tokens"], dur) if len(steps) else 0.0,
            "tokens_not_cached_at_finish": int(done["tokens_not_cached"].sum()),
            "req_to_token_bytes_reserved": row_bytes,
            "req_to_token_mean_used_frac": (_time_weighted_mean(steps["row_tokens"], dur) / ((cap_rows + 1) * meta["context_len"])
                                            if len(steps) else 0.0),
        },
    }
    if meta.get("hicache") is not None:
        summary.update(_hicache_summary(steps, dur, cached, meta["hicache"]))
    summary.update(_keep_up(steps, requests, done))
    causes = requests.loc[requests["aborted"], "abort_cause"] if "abort_cause" in requests else pd.Series(dtype=str)
    summary["abort_causes"] = {c: int((causes == c).sum()) for c in ABORT_CAUSES}
    evicting = steps["time_s"][steps["evicted_tokens"] > 0] if len(steps) else pd.Series(dtype=float)
    summary["first_eviction_s"] = float(evicting.iloc[0]) if len(evicting) else None
    # Which pool's shortage evicted: leaves deleted by MambaRadixCache.evict_mamba freed state slots (their KV
    # went with them); the rest were evicted for KV. A step table from before the column was recorded: unknown.
    by_mamba = steps["mamba_evicted_tokens"] if "mamba_evicted_tokens" in steps else None
    summary["mamba_evicted_tokens"] = int(by_mamba.sum()) if by_mamba is not None else None
    summary["first_mamba_eviction_s"] = _first_time(steps, by_mamba > 0) if by_mamba is not None else None
    slo_on = meta.get("slo_on") or "e2e"
    summary["slo_p99_s"] = meta.get("slo_p99_s")
    summary["slo_on"] = slo_on if meta.get("slo_p99_s") is not None else None
    summary["slo_observed_p99_s"] = summary[f"{slo_on}_s"]["p99"] if meta.get("slo_p99_s") is not None else None
    summary["first_retraction"] = _first_retraction(events[0]) if events else None
    spec = meta.get("speculative") or {}  # sim/speculative.py spec_summary; None each when speculation is off
    summary.update({key: spec.get(key) for key in SPECULATIVE_KEYS})
    _require_finite(summary)
    summary["verdict_status"], summary["verdict_failures"] = judge(summary)
    summary["verdict"] = verdict(summary)
    return summary


def _hicache_summary(steps: pd.DataFrame, dur: pd.Series, cached: int, info: dict) -> dict:
    """With --enable-hierarchical-cache (reports/METRICS.md, "HiCache"): the cached prompt tokens by the tier they
    came from (device: matched in GPU memory; host: loaded back from the host pool; storage: the L3 backend, not
    simulated) and the host pool's use and traffic."""
    def total(column: str) -> int:
        return int(steps[column].sum()) if len(steps) and column in steps else 0

    host = total("host_loaded_tokens")
    cap = info["host_tokens"]
    used = steps["host_used_size"] / cap if len(steps) and "host_used_size" in steps else pd.Series(dtype=float)
    return {
        "cached_prefill_tokens_by_tier": {"device": cached - host, "host": host, "storage": 0},
        "hicache": {
            "host_capacity_tokens": cap, "host_capacity_bytes": cap * info["size_per_token"],
            "write_policy": info["write_policy"], "hicache_ratio": info.get("hicache_ratio"),
            "host_peak_used_frac": float(used.max()) if len(used) else 0.0,
            "host_mean_used_frac": _time_weighted_mean(used, dur) if len(used) else 0.0,
            "loaded_back_tokens": host, "loaded_back_bytes": host * info["size_per_token"],
            "written_tokens": total("host_written_tokens"),
            "written_bytes": total("host_written_tokens") * info["size_per_token"],
            "host_evicted_tokens": total("host_evicted_tokens"),
            "dropped_tokens": total("dropped_tokens"),
            "demoted_tokens": info.get("demoted_tokens", 0),
            "recomputed_host_hit_tokens": info.get("recomputed_host_hit_tokens", 0),
            "backup_skipped_tokens": info.get("backup_skipped_tokens", 0),
            "link_bandwidth_bytes_s": info.get("link_bandwidth_bytes_s"),
            "storage": "not simulated" if info.get("storage_backend") else None,
        },
    }


def _event_pool(event: tuple) -> str:
    return event[3] if len(event) > 3 else "kv"  # one pool: always the KV pool


def _first_event(events: list, pool: str) -> float | None:
    return next((float(e[0]) for e in events if _event_pool(e) == pool), None)


def _earliest(*times: float | None) -> float | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None


def _first_retraction(event: tuple) -> dict:
    """``kv_tokens_held``: the tokens held then in the pool that ran short (the SWA pool's when it was that one);
    ``pool`` only on two-pool (hybrid SWA) runs, whose events name it."""
    first = {"time_s": float(event[0]), "running": int(event[1]), "kv_tokens_held": int(event[2])}
    if len(event) > 3:
        first.update(kv_tokens_held=int(event[4] if event[3] == "swa" else event[2]), pool=event[3])
    return first


def _keep_up(steps: pd.DataFrame, requests: pd.DataFrame, done: pd.DataFrame) -> dict:
    """The numbers that say whether the server kept up with the arrivals (reports/METRICS.md)."""
    n = len(requests)
    first = float(requests["arrival_s"].min()) if n else 0.0
    last = float(requests["arrival_s"].max()) if n else 0.0
    span = last - first
    waits = _queue_waits(steps, requests) if n else pd.Series(dtype=float)
    done_waits = waits[done.index] if n else waits
    share = (done_waits / done["e2e_s"]).where(done["e2e_s"] > 0) if n else waits
    backlog = int((requests["finish_s"] > last).sum()) if n else 0
    return {
        "arrival_span_s": span,
        "arrival_rate_req_s": n / span if span > 0 else None,
        "queue_wait_s": {**percentiles(done_waits), "mean": _mean(done_waits)},
        "queue_wait_share_p50": percentiles(share, (50,))["p50"],
        "backlog_at_last_arrival": backlog,
        "backlog_frac_at_last_arrival": backlog / n if n else 0.0,
    }


def _require_finite(summary: dict) -> None:
    """A result that is not a number never gets a verdict (a NaN duration would otherwise read 0 req/s, FITS)."""
    for key in ("duration_s", "throughput_req_s", "output_tok_s"):
        v = summary[key]
        if v is None or not math.isfinite(v):
            raise ValueError(f"the simulation's {key} is {v}: a step time was not a finite number (check the "
                             "step-time model's inputs: GPU specs, --calibration coefficients)")


def judge(summary: dict) -> tuple[str, str]:
    """(status, failures): status ``fits``, ``fits_with_retractions`` or ``does_not_fit``; failures: the rules
    that failed, space-separated, from ``aborts``, ``cannot_keep_up``, ``slo_missed`` (reports/METRICS.md)."""
    failures = []
    if summary["aborted"]:
        failures.append("aborts")
    if cannot_keep_up(summary):
        failures.append("cannot_keep_up")
    if summary.get("slo_p99_s") is not None:
        observed = summary.get("slo_observed_p99_s")
        if observed is None or observed > summary["slo_p99_s"]:
            failures.append("slo_missed")
    if failures:
        return "does_not_fit", " ".join(failures)
    return ("fits_with_retractions" if summary["retractions"] else "fits"), ""


def cannot_keep_up(summary: dict) -> bool:
    wait = summary["queue_wait_s"]["p50"]
    share = summary["queue_wait_share_p50"]
    if not summary["arrival_span_s"] or wait is None or wait < MIN_QUEUE_WAIT_S:
        return False  # a burst (all at once) has no arrival rate to keep up with; short waits are not a backlog
    return (share is not None and share >= MAX_QUEUE_WAIT_SHARE) or \
        summary["backlog_frac_at_last_arrival"] >= MAX_BACKLOG_FRAC


def _mean(s: pd.Series) -> float | None:
    s = s.dropna()
    return float(s.mean()) if len(s) else None


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def verdict(summary: dict) -> str:
    """The answer to "can this configuration serve this workload?", with the numbers that decided it, then
    what happened to the pools (retractions and evictions: when and why)."""
    status = summary.get("verdict_status") or judge(summary)[0]
    failures = (summary.get("verdict_failures") or "").split()
    reasons = []
    if "aborts" in failures:
        causes = ", ".join(f"{n:,} {ABORT_CAUSE_WORDS[c]}" for c, n in summary["abort_causes"].items() if n)
        reasons.append(f"{summary['aborted']:,} of {_n(summary['requests'], 'request')} aborted ({causes})")
    if "cannot_keep_up" in failures:
        wait = summary["queue_wait_s"]["p50"]
        reasons.append(
            f"it cannot keep up: the median request waited {_secs(wait)} for admission "
            f"({_pct(summary['queue_wait_share_p50'])} of its latency) and {summary['backlog_at_last_arrival']:,} of "
            f"{summary['requests']:,} requests ({_pct(summary['backlog_frac_at_last_arrival'])}) were unfinished at the "
            f"last arrival; served {summary['throughput_req_s']:.2f} req/s against {summary['arrival_rate_req_s']:.2f} "
            f"req/s arriving")
    if "slo_missed" in failures:
        observed = summary["slo_observed_p99_s"]
        reasons.append(f"p99 {summary['slo_on']} latency {_secs(observed)} exceeds the SLO of "
                       f"{_secs(summary['slo_p99_s'])}")
    if status == "does_not_fit":
        head = "DOES NOT FIT: " + "; ".join(reasons)
    else:
        wait = summary["queue_wait_s"]["p50"]
        head = (f"FITS: no abort, median admission wait {_secs(wait or 0.0)}"
                + (f", p99 {summary['slo_on']} {_secs(summary['slo_observed_p99_s'])} within the SLO of "
                   f"{_secs(summary['slo_p99_s'])}" if summary.get("slo_p99_s") is not None else ""))
    return head + ". " + _pool_story(summary)


def _pct(frac: float) -> str:
    """As the report and the console print a percentage (reports/units.py): 9.9%, <0.1%, never a rounded 0 or 100."""
    from poolsim.reports import units

    return units.percent(frac)


def _pool_story(summary: dict) -> str:
    parts = []
    first = summary.get("first_retraction")
    if summary["retractions"] and first:
        pool = "swa" if first.get("pool") == "swa" and "swa" in summary["pools"] else "kv"
        kind = "SWA KV" if pool == "swa" else "KV"
        cap = summary["pools"][pool]["capacity"]
        parts.append(
            f"Retracted {_n(summary['retracted_requests'], 'request')} ({_n(summary['retractions'], 'retraction')}) "
            f"because the next decode step needed more {kind} than was free: first at t={first['time_s']:.1f} s, "
            f"when {_n(first['running'], 'running request')} held {_pct(first['kv_tokens_held'] / cap)} of "
            f"{_tokens(cap)} {kind} tokens.")
    if summary.get("evicted_tokens"):
        parts.append(_eviction_story(summary))
    tiers = summary.get("cached_prefill_tokens_by_tier")
    if tiers is not None:
        h = summary["hicache"]
        parts.append(f"HiCache: {_tokens(tiers['host'])} cached prompt tokens were loaded back from the host pool "
                     f"(beside {_tokens(tiers['device'])} matched on the GPU), host pool peak "
                     f"{h['host_peak_used_frac']:.0%} of {_tokens(h['host_capacity_tokens'])} tokens.")
    binding = summary["binding_pool"]
    name = {"kv": "KV tokens", "rows": "request rows", "mamba": "mamba state slots",
            "swa": "SWA KV tokens"}.get(binding, "none")
    if binding:
        pool = summary["pools"][binding]
        peak = pool["peak_used_frac"]
        when = pool.get("first_exhausted_s")
        parts.append(f"{name[0].upper() + name[1:]} bind first: ran out at t={when:.1f} s, peak {_pct(peak)}."
                     if when is not None else
                     f"No pool ran out; the fullest: {name}, peak {_pct(peak)} ({_pct(1 - peak)} headroom).")
    return " ".join(parts)


def _eviction_story(summary: dict) -> str:
    """Names the pool whose shortage evicted (reports/METRICS.md, "The verdict"): mamba state slots for the
    tokens ``evict_mamba`` freed, else KV; on hybrid-SWA runs the step table cannot tell the full pool's
    shortage from the SWA pool's."""
    total, first = summary["evicted_tokens"], summary["first_eviction_s"]
    mamba = summary.get("mamba_evicted_tokens")
    if mamba is None:
        return f"Evicted {_tokens(total)} cached prefix tokens to make room, first at t={first:.1f} s."
    kv_room = "to make room in the KV pools (full or SWA)" if "swa" in summary["pools"] else \
        "to make room in the KV pool"
    mamba_room = "to free mamba state slots (the KV of a leaf goes with its state)"
    if not mamba:
        return f"Evicted {_tokens(total)} cached prefix tokens {kv_room}, first at t={first:.1f} s."
    if mamba == total:
        return f"Evicted {_tokens(total)} cached prefix tokens {mamba_room}, first at t={first:.1f} s."
    return (f"Evicted {_tokens(total)} cached prefix tokens, first at t={first:.1f} s: "
            f"{_tokens(total - mamba)} {kv_room} and {_tokens(mamba)} {mamba_room}, first at "
            f"t={summary['first_mamba_eviction_s']:.1f} s.")


def _secs(x: float) -> str:
    return f"{x * 1e3:.0f} ms" if x < 1 else (f"{x:.1f} s" if x < 600 else f"{x / 60:.0f} min")


def _tokens(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else (f"{n / 1e3:.1f}k" if n >= 1e3 else str(n))
