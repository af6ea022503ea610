"""What the report pages show, as rows of formatted numbers with links to their definitions (reports/METRICS.md)."""

from __future__ import annotations

import html
import json
import re

from markupsafe import Markup

from poolsim.reports import definitions, units

POOL_NAMES = {"kv": "KV tokens", "rows": "request rows", "mamba": "mamba state slots", "swa": "SWA KV tokens"}


def get_path(d: dict, dotted: str, default=None):
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return default
        d = d[part]
    return d


def flatten(d: dict, prefix: str = "") -> dict:
    """Nested dict -> {"a.b.c": value}; None sub-dicts (no first retraction) stay as one None entry."""
    out = {}
    for key, value in d.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# pool sizes are SGLang's own exact numbers (it logs them): shown in full, never as 2.43M
EXACT_COUNTS = ("capacity", "max_total_num_tokens", "swa_max_total_num_tokens")


def _by_unit(name: str, value, unit: str) -> str:
    if name.rsplit(".", 1)[-1] in EXACT_COUNTS and isinstance(value, (int, float)) and not isinstance(value, bool) \
            and float(value).is_integer():
        return units.count(value)
    return units.by_unit(value, unit)


def fmt(name: str, value) -> str:
    """``value`` formatted by the unit METRICS.md gives ``name`` (a qualified name)."""
    return _by_unit(name, value, definitions.lookup(name).unit)


def metric_link(name: str, label: str | None = None) -> Markup:
    """A link to ``name``'s definition on the page; KeyError if METRICS.md does not define it."""
    m = definitions.lookup(name)
    text = label if label is not None else name.split(".", 1)[1]
    return Markup('<a class="metric" href="#{}" title="{}">{}</a>').format(m.anchor, m.unit, text)


def definition_html(metric: definitions.Metric, namespace: str) -> Markup:
    """A definition's text with `code` spans, those naming a metric of the same file linked."""
    known = definitions.index()
    parts = re.split(r"`([^`]+)`", metric.text)
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            out.append(html.escape(part))
            continue
        target = known.get(f"{namespace}.{part}")
        code = f"<code>{html.escape(part)}</code>"
        out.append(f'<a href="#{target.anchor}">{code}</a>' if target is not None and target is not metric else code)
    return Markup("".join(out))


def _row(name: str, label: str, value) -> dict:
    return {"link": metric_link(name, label), "value": fmt(name, value), "raw": "" if value is None else str(value)}


# ---------------------------------------------------------------- page content
def verdict_state(summary: dict) -> str:
    """fits | retracts | aborts | does-not-fit (cannot keep up or SLO missed); aborts wins over the others."""
    if summary.get("aborted"):
        return "aborts"
    if summary.get("verdict_status") == "does_not_fit":
        return "does-not-fit"
    return "retracts" if summary.get("retractions") else "fits"


def _deciding_fact(summary: dict) -> Markup | None:
    """The numbers the verdict's rules are decided on (METRICS.md, summary.verdict_status)."""
    if "queue_wait_s" not in summary:
        return None
    share, rate = summary.get("queue_wait_share_p50"), summary.get("arrival_rate_req_s")
    fact = Markup("Deciding numbers: {} {} ({} {}); {} {} of {} ({}); {} {}, {} {}").format(
        metric_link("summary.queue_wait_s.p50", "admission wait p50"), units.seconds(summary["queue_wait_s"]["p50"]),
        units.percent(share) if share is not None else units.DASH,
        metric_link("summary.queue_wait_share_p50", "of latency"),
        metric_link("summary.backlog_at_last_arrival", "unfinished at the last arrival"),
        units.count(summary["backlog_at_last_arrival"]), units.count(summary["requests"]),
        units.percent(summary["backlog_frac_at_last_arrival"]),
        metric_link("summary.arrival_rate_req_s", "arriving"), fmt("summary.arrival_rate_req_s", rate),
        metric_link("summary.throughput_req_s", "served"), fmt("summary.throughput_req_s", summary["throughput_req_s"]))
    if summary.get("slo_p99_s") is not None:
        fact += Markup("; {} {} {}, target {}").format(
            metric_link("summary.slo_observed_p99_s", "SLO p99"), summary["slo_on"],
            units.seconds(summary["slo_observed_p99_s"]), units.seconds(summary["slo_p99_s"]))
    if summary.get("aborted"):
        causes = [f"{k.replace('_', ' ')} {v}" for k, v in summary.get("abort_causes", {}).items() if v]
        fact += Markup("; {} by cause: {}").format(metric_link("requests.abort_cause", "aborted"), ", ".join(causes))
    return fact + Markup(".")


def would_fit_fact(run: dict) -> list[Markup]:
    """DOES NOT FIT: what would (run.json ``would_fit``, app/suggest.py), as the command to run."""
    if "would_fit" not in run:
        return []
    fit = run["would_fit"]
    link = metric_link("run.would_fit", "What would fit")
    if not isinstance(fit, dict):
        tried = ", ".join(run.get("would_fit_tried") or [])
        return [Markup("{}: none of {} (a sweep searches further).").format(link, tried)]
    return [Markup("{}: <code>{}</code> ({} GPUs: {}).").format(link, fit.get("command", ""), fit.get("gpus"),
                                                               str(fit.get("verdict_status", "")).replace("_", " "))]


def verdict_facts(summary: dict) -> list[Markup]:
    pools = summary["pools"]
    facts = []
    deciding = _deciding_fact(summary)
    if deciding is not None:
        facts.append(deciding)
    binding = summary.get("binding_pool")
    if binding in pools:
        when = pools[binding].get("first_exhausted_s")
        how = (f"ran out first, at t = {units.seconds(when)}" if when is not None
               else f"has the highest peak use, {units.percent(pools[binding]['peak_used_frac'])}, without running "
                    "out (no retraction, always at least a page free or evictable)")
        facts.append(Markup("{}: {} {}.").format(metric_link("summary.binding_pool", "Binding pool"),
                                                 POOL_NAMES.get(binding, binding), how))
    headroom = [Markup("{} {}").format(POOL_NAMES.get(p, p), units.percent(1 - pools[p]["peak_used_frac"]))
                for p in pools if "peak_used_frac" in pools[p]]
    if headroom:
        facts.append(Markup("Headroom at peak ({}): {}.").format(
            metric_link("summary.pools.kv.peak_used_frac", "1 − peak used"), Markup(", ").join(headroom)))
    if "requests" in summary:
        facts.append(Markup("Requests: {} {} of {}, {} {}, {} {} ({} {}).").format(
            units.count(summary.get("finished")), metric_link("summary.finished", "finished"),
            units.count(summary["requests"]), units.count(summary.get("aborted")),
            metric_link("summary.aborted", "aborted"), units.count(summary.get("retracted_requests")),
            metric_link("summary.retracted_requests", "retracted"), units.count(summary.get("retractions")),
            metric_link("summary.retractions", "retractions")))
    p99 = [(k, get_path(summary, f"{k}.p99")) for k in ("ttft_s", "e2e_s")]
    if any(v is not None for _, v in p99):
        facts.append(Markup("p99 latency: {} {}, {} {}.").format(
            metric_link("summary.ttft_s.p99", "TTFT"), units.seconds(p99[0][1]),
            metric_link("summary.e2e_s.p99", "end-to-end"), units.seconds(p99[1][1])))
    return facts


def _value_text(key: str, value) -> str:
    """A run.json value with no METRICS.md entry, formatted by its name."""
    if value is None:
        return units.DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        text = ", ".join(map(str, value[:12])) + (f", … ({len(value)} in all)" if len(value) > 12 else "")
        return text or units.DASH
    if isinstance(value, dict):
        return json.dumps(value, default=str)[:200]
    if isinstance(value, (int, float)):
        if key.endswith("_gib") or "_gib_" in key:  # weights_gib_per_rank too
            return f"{units.sig3(value)} GiB"
        if key.endswith("_bytes"):
            return units.nbytes(value)
        if key.endswith("_s"):
            return units.seconds(value)
        return units.count(value) if float(value).is_integer() else units.sig3(value)
    return str(value)


def run_value(key: str, value) -> str:
    """A run.json value: by its METRICS.md unit where it has one, else by its name."""
    known = definitions.index().get(f"run.{key}")
    if known is not None and known.unit != "text" and not isinstance(value, (list, tuple, dict, str)):
        return _by_unit(key, value, known.unit)
    return _value_text(key, value)


def _config_row(key: str, label: str, value) -> dict:
    link = metric_link(f"run.{key}", label) if f"run.{key}" in definitions.index() else Markup.escape(label)
    return {"link": link, "value": run_value(key, value), "raw": str(value)}


def configuration(run: dict) -> dict:
    """The run.json content as table rows; whatever keys are there, none required."""
    general = [_config_row(k, label, run[k]) for k, label in (
        ("model", "model"), ("gpu", "GPU"), ("poolsim_version", "poolsim version"), ("seed", "seed"),
        ("step_time_model", "step-time model")) if k in run]
    trace = run.get("trace") if isinstance(run.get("trace"), dict) else {}
    general += [_config_row(f"trace.{k}", f"trace {k.removesuffix('_s')}", trace[k]) for k in trace]
    flags = run.get("server_args") if isinstance(run.get("server_args"), dict) else {}
    raw_plan = run.get("memory_plan") if isinstance(run.get("memory_plan"), dict) else {}
    flag_rows = [{"flag": "--" + k.replace("_", "-"), "value": _value_text(k, v)} for k, v in flags.items()
                 if _flag_applies(k, raw_plan)]
    plan = flatten(raw_plan)
    # a plan field that does not apply to the model (no SWA pool, no mamba state) is None: not shown
    plan_rows = [_config_row(f"memory_plan.{k}", k, v) for k, v in plan.items() if v is not None and v != []]
    known = {"model", "gpu", "poolsim_version", "seed", "step_time_model", "trace", "server_args", "memory_plan",
             "hybrid_compare", "would_fit", "would_fit_tried"}
    other = [_config_row(k, k, v) for k, v in run.items() if k not in known]
    return {"general": general, "flags": flag_rows, "plan": plan_rows, "other": other}


def _flag_applies(flag: str, plan: dict) -> bool:
    """Whether a server flag can matter for the planned model: the mamba flags need mamba state, the SWA ratio an
    SWA pool (with no plan recorded, every flag is shown)."""
    if not plan:
        return True
    if flag.startswith("mamba_") or flag == "max_mamba_cache_size":
        return plan.get("mamba") is not None
    if flag == "swa_full_tokens_ratio":
        return plan.get("swa_pool") is not None or plan.get("sliding_window") is not None
    return True


SUMMARY_GROUPS = (
    ("Requests and throughput", (
        ("requests", "requests"), ("finished", "finished"), ("aborted", "aborted"),
        ("retracted_requests", "retracted requests"), ("retractions", "retractions"), ("steps", "forward steps"),
        ("duration_s", "duration"), ("throughput_req_s", "request throughput"),
        ("input_tok_s", "input throughput"), ("output_tok_s", "output throughput"))),
    ("Prefix cache", (
        ("cache_hit_rate", "hit rate"), ("prefill_tokens", "prefill tokens computed"),
        ("cached_prefill_tokens", "prefill tokens reused"), ("evicted_tokens", "tokens evicted"))),
    ("Fragmentation", (
        ("fragmentation.mean_partial_page_tokens", "partial-page slots (mean)"),
        ("fragmentation.tokens_not_cached_at_finish", "KV not cached at finish"),
        ("fragmentation.req_to_token_bytes_reserved", "req_to_token reserved"),
        ("fragmentation.req_to_token_mean_used_frac", "req_to_token used (mean)"))),
    ("First retraction", (
        ("first_retraction.time_s", "at"), ("first_retraction.running", "running requests"),
        ("first_retraction.kv_tokens_held", "KV held"))),
    ("Speculative decoding", (  # shown only when the run decoded speculatively (the keys are empty otherwise)
        ("speculative_algorithm", "algorithm"), ("speculative_accept_length_source", "acceptance given"),
        ("speculative_accept_length", "accept length"), ("speculative_accept_rate", "accept rate"),
        ("speculative_tokens_per_step", "tokens per decode step"),
        ("speculative_draft_overhead", "draft share of decode time"))),
)
LATENCY_ROWS = (("ttft_s", "time to first token"), ("itl_s", "inter-token latency"), ("e2e_s", "end-to-end"))
LATENCY_COLS = ("p50", "p90", "p99", "mean")
POOL_COLS = (("capacity", "capacity"), ("peak_used_frac", "peak used"), ("mean_used_frac", "mean used"),
             ("first_exhausted_s", "first exhausted at"), ("mean_idle_slots", "mean idle slots"))


def summary_tables(summary: dict) -> dict:
    groups = []
    for title, keys in SUMMARY_GROUPS:
        rows = [_row(f"summary.{k}", label, get_path(summary, k)) for k, label in keys if _has(summary, k)]
        if title == "Speculative decoding" and not summary.get("speculative_algorithm"):
            continue
        if title == "First retraction" and summary.get("first_retraction") is None and "first_retraction" in summary:
            rows = [{"link": metric_link("summary.first_retraction.time_s", "first retraction"), "value": "none",
                     "raw": ""}]
        if rows:
            groups.append({"title": title, "rows": rows})
    latency = [{"link": metric_link(f"summary.{k}.p50", label),
                "cells": [_cell(f"summary.{k}.{c}", get_path(summary, f"{k}.{c}")) for c in LATENCY_COLS]}
               for k, label in LATENCY_ROWS if isinstance(summary.get(k), dict)]
    names = [p for p in summary["pools"] if f"summary.pools.{p}.capacity" in definitions.index()]
    cols = [(c, label) for c, label in POOL_COLS if any(c in summary["pools"][p] for p in names)]
    pools = [{"link": metric_link(f"summary.pools.{p}.capacity", POOL_NAMES.get(p, p)),
              "cells": [_cell(f"summary.pools.{p}.{c}", summary["pools"][p][c]) if c in summary["pools"][p]
                        else {"value": "", "link": None, "raw": ""} for c, _ in cols]}
             for p in names]
    return {"groups": groups, "latency": latency, "latency_cols": LATENCY_COLS, "pools": pools,
            "pool_cols": [label for _, label in cols]}


def _has(d: dict, dotted: str) -> bool:
    sentinel = object()
    return get_path(d, dotted, sentinel) is not sentinel


def _cell(name: str, value) -> dict:
    m = definitions.lookup(name)
    return {"value": _by_unit(name, value, m.unit), "link": f"#{m.anchor}", "raw": "" if value is None else str(value)}


def definitions_for_page(namespaces: tuple[str, ...] | None = None) -> list[dict]:
    """METRICS.md's sections for a page's definitions: all, or those of ``namespaces`` (in file order)."""
    return [{"title": s.title, "metrics": [{"anchor": m.anchor, "names": [n.split(".", 1)[1] for n in m.names],
                                            "unit": m.unit, "text": definition_html(m, s.namespace)}
                                           for m in s.metrics]}
            for s in definitions.load() if namespaces is None or s.namespace in namespaces]


def summary_rows(summary: dict) -> list[tuple[str, object, str]]:
    """(qualified metric, value, unit) for every summary number; a null group (no first retraction) is written
    as its fields, empty, so every run's CSV has the same rows."""
    known = definitions.index()
    rows = []
    for key, value in flatten(summary).items():
        name = f"summary.{key}"
        children = [n for n in known if n.startswith(name + ".")] if value is None and name not in known else []
        rows += [(n, None, known[n].unit) for n in children] or [(name, value, known[name].unit if name in known
                                                                     else "")]
    return rows


def comparison_config(runs: list[dict]) -> list[dict]:
    """One row per configuration item (run.json) any run has; ``differs`` marks rows where the runs disagree."""
    flat = [{k: v for k, v in flatten(r).items() if not k.startswith("hybrid_compare")} for r in runs]
    rows = []
    for key in dict.fromkeys(k for f in flat for k in f):
        values = [run_value(key, f[key]) if key in f else units.DASH for f in flat]
        if key.startswith("server_args."):
            link = metric_link("run.server_args", "--" + key.split(".", 1)[1].replace("_", "-"))
        else:
            link = metric_link(f"run.{key}", key) if f"run.{key}" in definitions.index() else Markup.escape(key)
        rows.append({"link": link, "cells": values, "differs": len(set(values)) > 1})
    return rows


def comparison_summary(summaries: list[dict]) -> list[dict]:
    """One row per summary number any run has, formatted; ``differs`` as in ``comparison_config``."""
    known = definitions.index()
    keys = list(dict.fromkeys(k for s in summaries for k in flatten(s) if f"summary.{k}" in known
                              and k != "verdict"))
    rows = []
    for k in keys:
        values = [fmt(f"summary.{k}", get_path(s, k)) if _has(s, k) else units.DASH for s in summaries]
        rows.append({"link": metric_link(f"summary.{k}", k), "cells": values, "differs": len(set(values)) > 1})
    return rows
