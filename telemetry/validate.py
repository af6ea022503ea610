"""``poolsim validate --measured FILE...``: poolsim against what a real SGLang server measured.

Step sources (forward-pass metrics, server logs): every unmarked step's predicted time for the same composition
against its measured time, ``100 (predicted / measured - 1)`` per step, overall and per kind; the server log's
startup sizes against poolsim's plan of the same flags; the log's ``cuda graph`` flag against whether the model
prices a graph replay. Run sources (bench_serving results): poolsim's ``bench`` on the workload the result describes
(its lengths exactly where ``--output-details`` recorded them) against the measured throughput, TTFT, TPOT, ITL and
E2E, signed errors; per request where the details exist.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

from poolsim.app.bench_serving import BenchConfig, run_bench
from poolsim.kernels import calibrate as cal
from poolsim.sim import step_time
from poolsim.telemetry.fit import cost_of, error_pct, usable_steps
from poolsim.telemetry.steps import KINDS, ROW_COLUMNS
from poolsim.traces.bench_serving import DEFAULT_SEED
from poolsim.traces.request import Request

# log key -> MemoryPlan attribute: the sizes both state
SIZES = {"max_total_num_tokens": "max_total_num_tokens", "max_running_requests": "max_running_requests",
         "max_prefill_tokens": "max_prefill_tokens", "chunked_prefill_size": "chunked_prefill_size",
         "context_len": "context_len"}
RUN_METRICS = ("output_throughput", "request_throughput", "total_throughput",
               *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2e_latency") for s in ("mean", "median", "p99")))
WORKLOAD_CHECKS = ("total_input_tokens", "total_output_tokens", "completed")  # same workload? (not errors)


# what `validate --measured --out DIR` writes (the only names DIR may already hold)
OUTPUT_FILES = ("validation.html", "validation.json", "steps.csv")
STEP_TABLE_DROP = ("marks",)  # a usable step has none


def coefficients(calibration) -> tuple:
    if calibration:
        return step_time.Coefficients.from_calibration(calibration), step_time.calibration_source(calibration)
    return step_time.Coefficients(), "poolsim's fitted defaults"


def validate_steps(sources, model, gpu, args, *, calibration=None, runtime_overhead_gib=None) -> dict:
    return validate_steps_table(sources, model, gpu, args, calibration=calibration,
                                runtime_overhead_gib=runtime_overhead_gib)[0]


def validate_steps_table(sources, model, gpu, args, *, calibration=None, runtime_overhead_gib=None):
    """``validate_steps``' result and its per-step table: one row per usable step, in file order, with the step's
    composition (``MeasuredStep.to_row``), ``measured_s``, ``predicted_s`` and ``error_pct``,
    ``100 (predicted_s / measured_s - 1)``."""
    import pandas as pd

    cost, plan = cost_of(model, gpu, args, runtime_overhead_gib)
    k, where = coefficients(calibration)
    steps, skipped = usable_steps(sources)
    meas = np.array([s.measured_s for s in steps], dtype=float)
    pred = cal.predict(cost, k, steps) if steps else np.zeros(0)
    kinds = np.array([s.kind for s in steps])
    by_kind = {kind: {"steps": int((kinds == kind).sum()), **error_pct(pred[kinds == kind], meas[kinds == kind])}
               for kind in KINDS}
    out = {"steps": len(steps), "skipped": dict(skipped.counts), "step_time_error_pct": error_pct(pred, meas),
           "by_kind": by_kind, "coefficients": where,
           "files": [{"path": s.path, "format": s.format, "steps": len(s.steps), "usable": len(s.usable()),
                      "skipped": dict(usable_steps([s])[1].counts), "notes": s.notes} for s in sources],
           "first_skipped_at": dict(skipped.first)}
    model_ = step_time.AnalyticStepTime(cost, k)
    graphs = [(s, model_.uses_graph(s.prefill_tokens, s.num_prefill_reqs + s.num_decode_reqs)) for s in steps
              if s.cuda_graph is not None]
    off = [s for s, g in graphs if g != s.cuda_graph]
    if graphs:
        out["cuda_graph"] = {"lines": len(graphs), "disagree": len(off),
                             "first_disagreement": off[0].where() if off else None,
                             "poolsim_cuda_graph_max_bs": cost.cuda_graph_max_bs}
    sizes = [_sizes(src.path, entry, plan) for src in sources for entry in getattr(src, "sizes", [])]
    if sizes:
        out["sizes"] = sizes
    table = pd.DataFrame([s.to_row() for s in steps], columns=list(ROW_COLUMNS)).drop(columns=list(STEP_TABLE_DROP))
    # the one composition field to_row leaves out, and the prediction reads (the causal prefill pairs)
    table.insert(table.columns.get_loc("prefill_prefix_tokens") + 1, "prefill_len_var",
                 [s.prefill_len_var for s in steps])
    table["predicted_s"] = pred
    table["error_pct"] = 100 * (pred / meas - 1)
    return out, table


def _sizes(path: str, entry: dict, plan) -> dict:
    row = {"file": path, "line": entry.get("summary_line", entry.get("line"))}
    for key, attr in SIZES.items():
        if key in entry:
            row[key] = {"log": entry[key], "poolsim": getattr(plan, attr)}
    mamba = entry.get("mamba_cache") or {}
    if "max_mamba_cache_size" in mamba:
        row["max_mamba_cache_size"] = {"log": mamba["max_mamba_cache_size"], "poolsim": plan.max_mamba_cache_size}
    row["equal"] = all(v["log"] == v["poolsim"] for v in row.values() if isinstance(v, dict))
    return row


# ------------------------------------------------------------------------------------------ bench_serving runs
def bench_config(run, *, seed: int | None, dataset_path=None):
    """The poolsim BenchConfig of a measured run, and what was assumed; or (None, why) when it cannot be replayed."""
    w = run.workload
    if w["request_rate"] == "trace":
        return None, {"not_replayed": "request_rate \"trace\": the run sent a timestamped trace, not a rate"}
    ds = w["dataset_name"]
    if ds not in ("random", "random-ids", "sharegpt"):
        return None, {"not_replayed": f"dataset {ds!r}: poolsim bench draws random, random-ids and sharegpt"}
    if ds == "sharegpt" and dataset_path is None and run.details is None:
        return None, {"not_replayed": "dataset sharegpt without --output-details needs --dataset-path"}
    if ds != "sharegpt" and (w["random_input_len"] is None or w["random_output_len"] is None):
        return None, {"not_replayed": f"dataset {ds}: the result has no random_input_len / random_output_len"}
    used_seed = w["seed"] if w["seed"] is not None else (DEFAULT_SEED if seed is None else seed)
    assumed = {"seed": used_seed, "seed_from": "the result" if w["seed"] is not None else (
        "--seed" if seed is not None else f"bench_serving's default ({DEFAULT_SEED}): the result does not record it"),
        "num_prompts": w["num_prompts"], "num_prompts_from": w["num_prompts_from"],
        "warmup_requests": "1 (bench_serving's default; the result does not record it)"}
    rate = float(w["request_rate"])
    kw = dict(dataset_name=ds, num_prompts=w["num_prompts"], random_input_len=w["random_input_len"] or 1024,
              random_output_len=w["random_output_len"] or 1024, random_range_ratio=float(w["random_range_ratio"] or 0),
              request_rate=rate, max_concurrency=w["max_concurrency"], seed=used_seed,
              dataset_path=str(dataset_path) if dataset_path else None, sharegpt_output_len=w["sharegpt_output_len"],
              sharegpt_standin=ds == "random" and dataset_path is None)
    if run.details is None:
        if kw["sharegpt_standin"]:
            assumed["prompts"] = "stand-in texts (no --dataset-path): lengths as drawn, prompts share no text"
        return BenchConfig(**kw), assumed
    ok = run.details["ok"]
    ins = tuple(n for n, good in zip(run.details["input_lens"], ok) if good)
    outs = tuple(n for n, good in zip(run.details["output_lens"], ok) if good)
    if not ins:
        return None, {"not_replayed": "--output-details: no request succeeded"}
    kw["num_prompts"] = len(ins)
    if ds == "sharegpt" and dataset_path is None:
        kw.update(dataset_name="random", sharegpt_standin=True)  # the lengths are the measured ones anyway
    assumed["lengths"] = (f"the {len(ins)} successful requests' input and output lengths (--output-details)"
                          + (f"; {len(ok) - len(ins)} failed requests left out" if len(ins) < len(ok) else ""))
    return MeasuredLengths(**kw, input_lens=ins, output_lens=outs), assumed


@dataclasses.dataclass(frozen=True)
class MeasuredLengths(BenchConfig):
    """A bench_serving run with the lengths its details recorded: the draw (prompt identity, send times) of the
    same seed, each request given its measured input and output length."""

    input_lens: tuple = ()
    output_lens: tuple = ()

    def requests(self, rid_base, vocab_size):
        drawn = super().requests(rid_base, vocab_size)
        return [_resized(r, n, out, vocab_size) for r, n, out in zip(drawn, self.input_lens, self.output_lens)]


def _resized(r, n: int, out: int, vocab_size):
    ident = {}
    if r.token_ids is not None and vocab_size:  # random-ids: token j is (start + j) % vocab
        ident["token_ids"] = (int(r.token_ids[0]) + np.arange(n, dtype=np.int64)) % vocab_size
    elif r.segments:  # a ShareGPT text repeated and cut to the length
        seg, length = r.segments[0]
        full, rest = divmod(n, length)
        ident["segments"] = ((seg, length),) * full + (((seg, rest),) if rest else ())
    n, out = max(n, 1), max(out, 1)
    return Request(rid=r.rid, arrival_s=r.arrival_s, input_len=n, output_len=out, max_new_tokens=out,
                   ignore_eos=True, **ident)


def validate_runs(runs, model, gpu, args, *, calibration=None, runtime_overhead_gib=None, seed=None,
                  dataset_path=None) -> list[dict]:
    return validate_runs_detail(runs, model, gpu, args, calibration=calibration,
                                runtime_overhead_gib=runtime_overhead_gib, seed=seed, dataset_path=dataset_path)[0]


def validate_runs_detail(runs, model, gpu, args, *, calibration=None, runtime_overhead_gib=None, seed=None,
                         dataset_path=None) -> tuple[list[dict], list[dict | None]]:
    """``validate_runs``' rows and, per run, the TTFT pairs its per-request comparison used (``measured_s``,
    ``poolsim_s``: arrays in send order), None for a run without ``--output-details`` or not replayed."""
    out, pairs = [], []
    for run in runs:
        cfg, assumed = bench_config(run, seed=seed, dataset_path=dataset_path)
        workload = {k: v for k, v in run.workload.items() if not k.endswith("_from")}
        if workload["request_rate"] == math.inf:
            workload["request_rate"] = "inf"  # valid JSON (bench_serving writes Infinity)
        row = {"file": run.path, "line": run.line, "workload": workload, **assumed}
        out.append(row)
        pairs.append(None)
        if cfg is None:
            continue
        result, (m,) = run_bench([cfg], model, gpu, args, calibration=str(calibration) if calibration else None,
                                 runtime_overhead_gib=runtime_overhead_gib)
        row["metrics"] = {name: _compare(run.measured.get(name), m.get(name)) for name in RUN_METRICS
                          if name in run.measured}
        row["not_in_result"] = [n for n in RUN_METRICS if n not in run.measured]
        row["workload_check"] = {name: {"measured": run.measured.get(name), "poolsim": m.get(name)}
                                 for name in WORKLOAD_CHECKS}
        if run.details is not None:
            sim_ttft, meas = _ttft_pairs(run, result, cfg)
            row["per_request"] = {"requests": len(meas), "ttft_error_pct": error_pct(sim_ttft, meas)}
            pairs[-1] = {"measured_s": meas, "poolsim_s": sim_ttft}
    return out, pairs


def _compare(measured, predicted) -> dict:
    err = None if not measured or predicted is None else 100 * (predicted / measured - 1)
    return {"measured": measured, "poolsim": predicted, "error_pct": err}


def _ttft_pairs(run, result, cfg) -> tuple[np.ndarray, np.ndarray]:
    """TTFT per request (s), poolsim's request i against measured request i (send order); requests the server
    answered with no first token (TTFT 0) left out."""
    reqs = result.requests.sort_values("rid")
    reqs = reqs[~reqs["aborted"].astype(bool)].iloc[cfg.warmup_requests:]
    sim_ttft = (reqs["first_token_s"] - reqs["arrival_s"]).to_numpy()
    meas = np.array([t for t, good in zip(run.details["ttfts"], run.details["ok"]) if good], dtype=float)
    n = min(len(sim_ttft), len(meas))
    keep = meas[:n] > 0
    return sim_ttft[:n][keep].astype(float), meas[:n][keep]


# ------------------------------------------------------------------------------------------ --out DIR
def result_json(result: dict) -> str:
    """What ``validate --measured --json`` prints, and ``--out``'s ``validation.json`` holds."""
    return json.dumps(result, indent=2, default=str)


def page_config(model, gpu, args, *, calibration=None, runtime_overhead_gib=None) -> dict:
    """The page's configuration, in run.json's names: model, GPU, the coefficients' source, flags, memory plan."""
    from poolsim.pools.sizing.plan import plan_memory

    plan = plan_memory(model, gpu, args, runtime_overhead_gib=runtime_overhead_gib)
    return {"model": model.name, "gpu": gpu.name, "step_time_model": coefficients(calibration)[1],
            "server_args": dataclasses.asdict(args), "memory_plan": plan.to_dict()}


def write_validation(outdir, result: dict, table, pairs: list, config: dict) -> None:
    """``outdir`` (kernels.calibrate.OutputDir of ``OUTPUT_FILES``): ``steps.csv`` (the usable steps: composition,
    ``measured_s``, ``predicted_s``, ``error_pct``; only the header without step sources), ``validation.json`` and
    ``validation.html``. Everything is rendered before the first file is written; each file is replaced atomically,
    the page last."""
    import pandas as pd

    from poolsim.reports.validation import render_validation

    page = render_validation(result, table, pairs, config)
    if table is None:
        columns = [c for c in ROW_COLUMNS if c not in STEP_TABLE_DROP]
        columns.insert(columns.index("prefill_prefix_tokens") + 1, "prefill_len_var")
        table = pd.DataFrame(columns=[*columns, "predicted_s", "error_pct"])
    for name, text in (("steps.csv", table.to_csv(index=False)), ("validation.json", result_json(result) + "\n"),
                       ("validation.html", page)):
        outdir.write(name, lambda p, text=text: p.write_text(text, encoding="utf-8"))
