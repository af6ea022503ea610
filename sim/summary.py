"""Run summary and the OOM verdict in plain words. Every figure is defined in reports/METRICS.md."""

from __future__ import annotations

import pandas as pd

from sim.metrics import percentiles

SATURATED_TTFT_S = 1.0  # a binding pool at >= 99% with TTFT p90 above this reads as "saturated"


def _time_weighted_mean(values: pd.Series, durations: pd.Series) -> float:
    total = float(durations.sum())
    return float((values * durations).sum() / total) if total > 0 else 0.0


def _first_time(steps: pd.DataFrame, mask: pd.Series) -> float | None:
    hit = steps.loc[mask, "time_s"]
    return float(hit.iloc[0]) if len(hit) else None


def summarize(steps: pd.DataFrame, requests: pd.DataFrame, meta: dict) -> dict:
    """``meta``: per-replica capacities: ``max_total_num_tokens``, ``max_running_requests``,
    ``max_mamba_cache_size`` (0 if none), ``page_size``, ``context_len``, ``dp_size``."""
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

    pools = {
        "kv": {
            "capacity": cap_kv,
            "peak_used_frac": float(kv_used.max()) if len(kv_used) else 0.0,
            "mean_used_frac": _time_weighted_mean(kv_used, dur) if len(kv_used) else 0.0,
            "first_exhausted_s": _first_time(steps, (steps["retracted"] > 0) | (
                steps["available_size"] + steps["evictable_size"] < meta["page_size"])) if len(steps) else None,
        },
        "rows": {
            "capacity": cap_rows,
            "peak_used_frac": float(rows_used.max()) if len(rows_used) else 0.0,
            "mean_used_frac": _time_weighted_mean(rows_used, dur) if len(rows_used) else 0.0,
            "first_exhausted_s": _first_time(steps, steps["free_req_rows"] == 0) if len(steps) else None,
        },
    }
    if cap_mamba:
        mamba_used = (cap_mamba - steps["mamba_free_slots"] - steps["mamba_evictable_states"]) / cap_mamba
        pools["mamba"] = {
            "capacity": cap_mamba,
            "peak_used_frac": float(mamba_used.max()) if len(steps) else 0.0,
            "mean_used_frac": _time_weighted_mean(mamba_used, dur) if len(steps) else 0.0,
            "first_exhausted_s": _first_time(steps, steps["mamba_free_slots"] + steps["mamba_evictable_states"] == 0)
            if len(steps) else None,
            "mean_idle_slots": _time_weighted_mean(steps["mamba_free_slots"], dur) if len(steps) else 0.0,
        }
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
    events = sorted(meta.get("retraction_events", []))
    summary["first_retraction"] = (
        {"time_s": float(events[0][0]), "running": int(events[0][1]), "kv_tokens_held": int(events[0][2])}
        if events else None)
    summary["verdict"] = verdict(summary)
    return summary


def _mean(s: pd.Series) -> float | None:
    s = s.dropna()
    return float(s.mean()) if len(s) else None


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def verdict(summary: dict) -> str:
    """One sentence: fits / retracts / aborts, which pool binds first, and the headroom."""
    kv = summary["pools"]["kv"]
    parts = []
    first = summary.get("first_retraction")
    if summary["retractions"] and first:
        parts.append(
            f"retracted {_n(summary['retracted_requests'], 'request')} ({_n(summary['retractions'], 'retraction')}), "
            f"first at t={first['time_s']:.1f} s, when {_n(first['running'], 'running request')} held "
            f"{first['kv_tokens_held'] / kv['capacity']:.0%} of {_tokens(kv['capacity'])} KV tokens")
    if summary["aborted"]:
        parts.append(f"aborted {summary['aborted']} of {_n(summary['requests'], 'request')}")
    binding = summary["binding_pool"]
    name = {"kv": "KV tokens", "rows": "request rows", "mamba": "mamba state slots"}.get(binding, "none")
    if not parts:
        peak = summary["pools"][binding]["peak_used_frac"] if binding else 0.0
        text = f"Fits: no retraction or abort; {name} bind first at a peak of {peak:.0%} ({1 - peak:.0%} headroom)"
        queued = summary.get("peak_waiting", 0)
        if peak >= 0.99 and queued and (summary["ttft_s"]["p90"] or 0) > SATURATED_TTFT_S:
            text += (f", and the server is saturated: up to {_n(queued, 'request')} waited for admission "
                     f"(TTFT p90 {summary['ttft_s']['p90']:.1f} s)")
        return text + "."
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + f". The pool that ran out first: {name}."


def _tokens(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else (f"{n / 1e3:.1f}k" if n >= 1e3 else str(n))
