"""``poolsim calibrate --measured FILE...``: fit the step-time coefficients a real server's measured steps resolve.

The steps (forward-pass metrics and decode log lines, ``MeasuredStep``) carry the model's aggregate inputs, so the
fit is kernels/calibrate.py's, unchanged: the coefficients of the GPU's architecture and the architecture-independent
step terms that the training steps resolve (``resolvable``: no effect, or collinear with those taken, stays fixed),
bounded Levenberg-Marquardt on log error, each fitted coefficient's standard error, and the error on the held-out
contiguous blocks (``heldout_mask``: blocks 2 and 6 of 8, in the order the files and their lines give). Marked steps
(a decode log line whose interval also ran prefills, ...) are never fitted; they are counted with their reasons. The
training steps are thinned evenly to at most ``MAX_FIT_STEPS`` (the fit's cost grows with them; the held-out error
is over every held-out step).

What the two step sources measure differs: forward-pass metrics time the GPU span of each forward, a decode log line
the wall-clock cadence of its interval (CPU time the overlap scheduler does not hide included). The file records
which sources the fit saw.
"""

from __future__ import annotations

import dataclasses
import datetime
import json

import numpy as np

from poolsim.kernels import calibrate as cal
from poolsim.sim import step_time
from poolsim.telemetry.errors import Skips

MAX_FIT_STEPS = 3000


def cost_of(model, gpu, args, runtime_overhead_gib=None):
    """The step-time model's view of this server (as ``poolsim run`` prices steps), and its memory plan."""
    from poolsim.pools.sizing.plan import plan_memory

    plan = plan_memory(model, gpu, args, runtime_overhead_gib=runtime_overhead_gib)
    return step_time.ModelCost.from_model(model, gpu, plan, args), plan


def usable_steps(sources) -> tuple[list, Skips]:
    """Every unmarked step in file order, and what was left out: the readers' skips and each marked step under
    ``FORMAT: its marks``."""
    skipped, steps = Skips(), []
    for src in sources:
        skipped.merge(src.skips)
        for s in src.steps:
            if s.marks:
                skipped.add(f"{src.format}: {', '.join(s.marks)}", s.path, s.line)
            else:
                steps.append(s)
    return steps, skipped


def error_pct(pred, meas) -> dict:
    """Step-time error in percent, ``100 (predicted / measured - 1)``: median and p90 of its size, median signed."""
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    if not len(meas):
        return {"median_abs": None, "p90_abs": None, "median_signed": None}
    err = 100 * (pred / meas - 1)
    return {"median_abs": float(np.median(np.abs(err))), "p90_abs": float(np.percentile(np.abs(err), 90)),
            "median_signed": float(np.median(err))}


def train_mask(n: int, held: np.ndarray, limit: int = MAX_FIT_STEPS) -> np.ndarray:
    idx = np.flatnonzero(~held)
    if len(idx) > limit:
        idx = idx[np.unique(np.linspace(0, len(idx) - 1, limit).round().astype(int))]
    mask = np.zeros(n, dtype=bool)
    mask[idx] = True
    return mask


def calibrate_measured(sources, model, gpu, args, *, runtime_overhead_gib=None, calibration=None, out=None,
                       log=print) -> dict:
    """Fit, write ``out/calibration.json`` (the format ``--calibration`` reads), ``steps.csv``, ``report.md`` and
    ``calibration.png``; returns the record."""
    outdir = cal.OutputDir(out) if out is not None else None
    cost, _ = cost_of(model, gpu, args, runtime_overhead_gib)
    start = step_time.Coefficients.from_calibration(calibration) if calibration else step_time.Coefficients()
    steps, skipped = usable_steps(sources)
    if not steps:
        raise ValueError("no usable measured step in " + ", ".join(s.path for s in sources) + "; skipped: "
                         + ("; ".join(skipped.lines()) or "nothing"))
    meas = np.array([s.measured_s for s in steps])
    kinds = np.array([s.kind for s in steps])
    held = cal.heldout_mask(len(steps))
    train = train_mask(len(steps), held)
    train_steps = [s for s, t in zip(steps, train) if t]
    names = cal.resolvable(cost, train_steps, start)[0]
    bounds = cal.fit_bounds()
    if len(train_steps) < cal.MIN_STEPS_PER_COEFFICIENT * len(names):
        coeffs, fit_info = start, {"arch": cost.arch, "fitted": [], "fixed": {}, "note": (
            f"{len(train_steps)} training steps: too few to fit the {len(names)} coefficients they resolve "
            f"(need {cal.MIN_STEPS_PER_COEFFICIENT} per coefficient)")}
        log(f"fit skipped: {fit_info['note']}")
    else:
        result = cal.fit(cost, steps, meas, start=start, train=train)
        coeffs = result.coefficients
        fit_info = {"arch": cost.arch, "fitted": result.fitted, "fixed": result.fixed,
                    "iterations": result.iterations, "rel_se": result.rel_se,
                    "at_bound": [n for n in result.fitted if getattr(coeffs, n) in bounds[n]]}
    fit_info["start"] = dataclasses.asdict(start)
    fit_info["n_fit"] = int(train.sum())
    pred, before = cal.predict(cost, coeffs, steps), cal.predict(cost, start, steps)
    fit_info.update(cal.fit_report(kinds, pred, meas, held))
    fit_info["before"] = cal.fit_report(kinds, before, meas, held)
    fit_info["heldout_error_pct"] = error_pct(pred[held], meas[held])
    here = cal.candidates(cost.arch)[0]
    record = {
        "format": cal.FORMAT, "phase": "done", "source": "telemetry",
        "device": {"name": gpu.name, "device": "SGLang server telemetry", "type": "telemetry"},
        "fixture_only": False,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": cal.git_commit(), "model": model.name, "gpu": gpu.name,
        "server_args": dataclasses.asdict(args),
        "measured": [{"path": s.path, "format": s.format, "steps": len(s.steps), "usable": len(s.usable()),
                      "skipped": dict(s.skips.counts), "notes": s.notes} for s in sources],
        "skipped": dict(skipped.counts),
        "coefficients": {n: getattr(coeffs, n) for n in here},
        # absolute standard error of each fitted coefficient (rel_se in fit: that of its log)
        "standard_error": {n: getattr(coeffs, n) * se for n, se in fit_info.get("rel_se", {}).items()},
        "kept_defaults": {n: why for n, why in fit_info.get("fixed", {}).items() if n in here},
        "fit": fit_info,
    }
    if calibration:
        record["started_from"] = str(calibration)
    if fit_info["mape_heldout"] is not None:
        record["measured_error"] = (f"held-out step MAPE {fit_info['mape_heldout']:.1%} over "
                                    f"{fit_info['n_heldout']} measured steps of a real SGLang server")
    if outdir is not None:
        import pandas as pd

        rows = pd.DataFrame([s.to_row() for s in steps])
        rows["predicted_s"], rows["fitted_s"], rows["heldout"] = before, pred, held
        rows["error"] = pred / meas - 1
        outdir.write("steps.csv", lambda p: rows.to_csv(p, index=False))
        outdir.write_text("report.md", report_text(record))
        cal._plot(outdir, rows)
        outdir.write_text("calibration.json", json.dumps(record, indent=2, default=str) + "\n")
    return record


def _frac(x):
    return None if x is None else x / 100


def report_text(record: dict) -> str:
    f = record["fit"]

    def pct(x):
        return "-" if x is None else f"{x:.2%}"

    lines = [f"# poolsim calibration from telemetry: {record['model']} on {record['gpu']}", "",
             f"date {record['date']}, commit {record['commit']}", ""]
    for m in record["measured"]:
        lines.append(f"- {m['path']} ({m['format']}): {m['steps']} steps, {m['usable']} usable")
    lines += ["", f"steps fitted {f['n_fit']} of {f['n_train']} training steps; held out {f['n_heldout']} "
              f"({f['heldout']})", "", "| | before fit | after fit |", "| --- | --- | --- |",
              f"| MAPE train | {pct(f['before']['mape_train'])} | {pct(f['mape_train'])} |",
              f"| MAPE held-out | {pct(f['before']['mape_heldout'])} | {pct(f['mape_heldout'])} |",
              f"| p90 abs error | {pct(f['before']['p90_abs_error'])} | {pct(f['p90_abs_error'])} |",
              f"| held-out median abs error | | {pct(_frac(f['heldout_error_pct']['median_abs']))} |"]
    for k, s in f["by_kind"].items():
        lines.append(f"| {k} (n={s['n']}) MAPE | {pct(f['before']['by_kind'][k]['mape'])} | {pct(s['mape'])} |")
    se = f.get("rel_se", {})
    lines += ["", "fitted (with the relative standard error of each): "
              + (", ".join(f"{n} {record['coefficients'][n]:.4g} +-{se.get(n, float('nan')):.1%}"
                           for n in f["fitted"]) or f.get("note", "-")), ""]
    lines += [f"- {n} kept: {why}" for n, why in record["kept_defaults"].items()]
    if record["skipped"]:
        lines += ["", "not fitted:"] + [f"- {n} x {why}" for why, n in record["skipped"].items()]
    lines += ["", "![predicted vs measured](calibration.png)", ""]
    return "\n".join(lines)
