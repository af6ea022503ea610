"""``poolsim calibrate`` and ``poolsim validate``: replay a trace on a device, fit the step-time coefficients,
write the calibration file that ``poolsim run --calibration`` reads.

Phases (``calibration.json`` is rewritten after each, so a run cut short leaves a valid partial file):
  plan       sizes and versions recorded
  reference  the numpy simulation, one pool digest per step (kernels.replay.ReferenceRun)
  replay     the same simulation with the pools on the device, each step checked against the reference and the
             stand-in forward measured (kernels.replay.DeviceReplay); its step table must equal the reference's
  fit        the step-time model's fittable coefficients by bounded least squares on log error (``fit``),
             MAPE on train steps and on held-out contiguous blocks
The fit treats ``AnalyticStepTime(cost, coefficients)(shape)`` as a black box over
``dataclasses.fields(Coefficients)`` that have a range in ``sim.step_time.FIT_BOUNDS``.
On a CPU (``--device cpu --tiny``) the measurement is a synthetic timer with known coefficients and noise: the
result is a test fixture (``fixture_only: true``), never a GPU calibration.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np

from sim import step_time

FORMAT = "poolsim-calibration/1"
# Plausible range of each fittable coefficient; sim.step_time.FIT_BOUNDS replaces this where it exists.
FALLBACK_FIT_BOUNDS = {
    "mfu": (0.02, 1.0),
    "bw_efficiency": (0.05, 1.0),
    "overhead_s": (1e-5, 0.05),
    "link_bandwidth": (1e9, 2e12),
    "allreduce_latency_s": (1e-7, 1e-3),
}
HELDOUT_BLOCKS = (2, 6)  # of 8 contiguous blocks of the measured steps
NUM_BLOCKS = 8
MIN_STEPS_PER_COEFFICIENT = 4  # fewer training steps than this per fittable coefficient: no fit
SENSITIVITY_MIN = 1e-3  # a coefficient whose d log t / d log c stays below this on every step is not identifiable
OUTPUT_FILES = ("calibration.json", "steps.csv", "replay_steps.csv", "report.md", "calibration.png")


def fit_bounds() -> dict[str, tuple[float, float]]:
    return dict(getattr(step_time, "FIT_BOUNDS", FALLBACK_FIT_BOUNDS))


def fittable() -> list[str]:
    bounds = fit_bounds()
    return [f.name for f in dataclasses.fields(step_time.Coefficients) if f.name in bounds]


# ------------------------------------------------------------------------------------------------- fit
def predict(cost, coefficients, shapes) -> np.ndarray:
    model = step_time.AnalyticStepTime(cost, coefficients)
    return np.array([model(s) for s in shapes], dtype=float)


@dataclasses.dataclass
class FitResult:
    coefficients: object  # step_time.Coefficients
    fitted: list[str]  # identifiable: moved by the data
    fixed: list[str]  # not identifiable from these steps (kept at their starting value)
    iterations: int


def fit(cost, shapes, measured, start=None, train=None, max_iter: int = 60) -> FitResult:
    """Bounded Levenberg-Marquardt on ``log(predicted) - log(measured)`` over the log of each fittable
    coefficient (bounds: clipping in log space), forward-difference Jacobian of the black-box model."""
    start = start or step_time.Coefficients()
    bounds = fit_bounds()
    names = fittable()
    measured = np.asarray(measured, dtype=float)
    idx = np.arange(len(shapes)) if train is None else np.flatnonzero(train)
    sub = [shapes[i] for i in idx]
    logm = np.log(measured[idx])
    lo = np.log([bounds[n][0] for n in names])
    hi = np.log([bounds[n][1] for n in names])

    def coeffs(x):
        return dataclasses.replace(start, **{n: float(np.exp(v)) for n, v in zip(names, x)})

    def residual(x):
        return np.log(predict(cost, coeffs(x), sub)) - logm

    def jacobian(x, r, h=1e-6):
        cols = []
        for j in range(len(x)):
            xh = x.copy()
            xh[j] += h
            cols.append((residual(xh) - r) / h)
        return np.stack(cols, axis=1)

    x = np.clip(np.log([getattr(start, n) for n in names]), lo, hi)
    r = residual(x)
    cost_now = float(r @ r)
    lam, it = 1e-3, 0
    for it in range(1, max_iter + 1):
        J = jacobian(x, r)
        A, g = J.T @ J, J.T @ r
        improved = False
        while lam < 1e12:
            step = np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-12), -g)
            xn = np.clip(x + step, lo, hi)
            rn = residual(xn)
            cn = float(rn @ rn)
            if cn < cost_now:
                improved = True
                done = cost_now - cn < 1e-12 * max(cost_now, 1e-30) or np.abs(xn - x).max() < 1e-9
                x, r, cost_now, lam = xn, rn, cn, max(lam / 3, 1e-12)
                break
            lam *= 4
        if not improved or done:
            break
    J = jacobian(x, r)
    sens = np.abs(J).max(axis=0) if len(J) else np.zeros(len(names))
    fitted = [n for n, s in zip(names, sens) if s > SENSITIVITY_MIN]
    fixed = [n for n in names if n not in fitted]
    result = dataclasses.replace(coeffs(x), **{n: getattr(start, n) for n in fixed})
    return FitResult(result, fitted, fixed, it)


def heldout_mask(n: int) -> np.ndarray:
    """True for the steps in the held-out contiguous blocks."""
    block = np.minimum((np.arange(n) * NUM_BLOCKS) // max(n, 1), NUM_BLOCKS - 1)
    return np.isin(block, HELDOUT_BLOCKS)


def error_stats(pred, meas) -> dict:
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    if not len(meas):
        return {"n": 0, "mape": None, "p90_abs_error": None}
    err = np.abs(pred / meas - 1)
    return {"n": int(len(meas)), "mape": float(err.mean()), "p90_abs_error": float(np.percentile(err, 90))}


def fit_report(kinds, pred, meas, held) -> dict:
    kinds, pred, meas = np.asarray(kinds), np.asarray(pred, float), np.asarray(meas, float)
    out = {"n": int(len(meas)), "n_train": int((~held).sum()), "n_heldout": int(held.sum()),
           "heldout": f"blocks {', '.join(map(str, HELDOUT_BLOCKS))} of {NUM_BLOCKS} contiguous blocks",
           "mape": error_stats(pred, meas)["mape"],
           "mape_train": error_stats(pred[~held], meas[~held])["mape"],
           "mape_heldout": error_stats(pred[held], meas[held])["mape"],
           "p90_abs_error": error_stats(pred, meas)["p90_abs_error"],
           "by_kind": {k: error_stats(pred[kinds == k], meas[kinds == k]) for k in sorted(set(kinds.tolist()))},
           "end_to_end": {"predicted_s": float(pred.sum()), "measured_s": float(meas.sum()),
                          "error": float(pred.sum() / meas.sum() - 1) if meas.sum() else None}}
    return out


# ------------------------------------------------------------------------------------------------- synthetic timer
def synthetic_truth():
    """Known coefficients for the CPU path: each fittable default moved by a fixed factor, kept in bounds."""
    base, bounds = step_time.Coefficients(), fit_bounds()
    factors = (0.8, 1.25, 1.6, 0.7, 1.4)
    moved = {}
    for n, f in zip(fittable(), factors * 4):
        lo, hi = bounds[n]
        moved[n] = float(min(max(getattr(base, n) * f, lo), hi))
    return dataclasses.replace(base, **moved)


class SyntheticTimer:
    """Stands in for the device's measurement: the model at known coefficients times log-normal noise."""

    def __init__(self, cost, truth, noise: float = 0.01, seed: int = 0):
        self.model = step_time.AnalyticStepTime(cost, truth)
        self.truth, self.noise = truth, noise
        self.rng = np.random.default_rng(seed)

    def __call__(self, shape) -> float:
        return float(self.model(shape) * np.exp(self.noise * self.rng.standard_normal()))


# ------------------------------------------------------------------------------------------------- environment
def device_info(device: str) -> dict:
    import importlib.metadata as md

    import torch

    def ver(pkg):
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    dev = torch.device(device)
    info = {"device": str(dev), "type": dev.type, "torch": torch.__version__, "triton": ver("triton"),
            "fla_core": ver("fla-core"), "simpy": ver("simpy")}
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        info.update(name=p.name, sm_count=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1),
                    cuda=torch.version.cuda)
    else:
        info.update(name="cpu", sm_count=None)
    return info


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# ------------------------------------------------------------------------------------------------- output folder
class OutputDir:
    """Files poolsim writes here, each replaced atomically; a folder holding anything else is refused."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.exists():
            if not self.path.is_dir():
                raise ValueError(f"--out {self.path}: exists and is not a folder")
            foreign = sorted(p.name for p in self.path.iterdir() if p.name not in OUTPUT_FILES)
            if foreign:
                raise ValueError(f"--out {self.path}: holds files poolsim did not write ({', '.join(foreign[:3])}); "
                                 "choose an empty or new folder")

    def write(self, name: str, write) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / f".{name}.tmp"
        try:
            write(tmp)
            os.replace(tmp, self.path / name)
        finally:
            tmp.unlink(missing_ok=True)

    def write_text(self, name: str, text: str) -> None:
        self.write(name, lambda p: p.write_text(text))


# ------------------------------------------------------------------------------------------------- the command
def calibrate(trace, model, gpu, args, *, out: str | Path | None, opts, trace_info: dict | None = None,
              runtime_overhead_gib: float | None = None, max_new_tokens: str = "trace",
              calibration: str | None = None, noise: float = 0.01, refit: bool = True, log=print) -> dict:
    """The whole path; returns the calibration record (also written to ``out/calibration.json``)."""
    import pandas as pd

    from kernels.replay import STEP_FIELDS, DeviceReplay, PoolMismatch, ReferenceRun
    from pools.sizing import plan_memory
    from sim.run import simulate

    t0 = time.perf_counter()
    outdir = OutputDir(out) if out is not None else None
    plan = plan_memory(model, gpu, args, runtime_overhead_gib=runtime_overhead_gib)
    cost = step_time.ModelCost.from_model(model, gpu, plan)
    start = step_time.Coefficients.from_calibration(calibration) if calibration else step_time.Coefficients()
    truth = None
    if opts.device == "cpu" or opts.tiny:
        truth = synthetic_truth()
        opts.synthetic = SyntheticTimer(cost, truth, noise, seed=opts.seed)
    info = device_info(opts.device)
    record = {
        "format": FORMAT, "phase": "plan", "device": info,
        "fixture_only": truth is not None,  # a CPU / synthetic calibration is a test fixture, never a GPU one
        "synthetic_timer": None if truth is None else {"coefficients": dataclasses.asdict(truth), "noise": noise},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(), "model": model.name, "gpu": gpu.name, "server_args": dataclasses.asdict(args),
        "trace": trace_info or {}, "tiny": opts.tiny,
        "layers": None, "pool_check": None, "replay": None, "fit": None, "wall_s": None,
    }
    if calibration:
        record["validated_against"] = str(calibration)

    def save(phase):
        record["phase"] = phase
        record["wall_s"] = round(time.perf_counter() - t0, 3)
        if outdir is not None:
            outdir.write_text("calibration.json", json.dumps(record, indent=2, default=str) + "\n")

    replay = DeviceReplay(model, plan, opts)
    kinds: dict[str, int] = {}
    for lid, layer in enumerate(model.layers):
        kinds.setdefault(f"{layer.mixer}+{layer.mlp}", 0)
        kinds[f"{layer.mixer}+{layer.mlp}"] += 1
    record["layers"] = {"spec": opts.layers, "run": replay.layer_ids, "model_layers": len(model.layers),
                        "per_kind": kinds, "dims": dataclasses.asdict(replay.dims)}
    save("plan")
    log(f"plan: {plan.max_total_num_tokens:,} KV tokens, {plan.max_running_requests} rows"
        + (f", {plan.max_mamba_cache_size} state slots" if plan.max_mamba_cache_size else "")
        + f"; running layers {replay.layer_ids} of {len(model.layers)} on {info['device']}")

    sim_kw = dict(trace_info=trace_info, max_new_tokens=max_new_tokens, calibration=calibration,
                  runtime_overhead_gib=runtime_overhead_gib)
    ref = ReferenceRun()
    reference = simulate(trace, model, gpu, args, replay=ref, **sim_kw)
    save("reference")
    log(f"reference: {len(ref.digests):,} steps simulated on numpy pools")

    replay.reference = ref.digests
    try:
        device_run = simulate(trace, model, gpu, args, replay=replay, **sim_kw)
        same = device_run.steps.to_csv(index=False) == reference.steps.to_csv(index=False)
        if not same:
            raise PoolMismatch(replay.step, "the step table", "device and numpy runs scheduled differently")
    except PoolMismatch as e:
        record["pool_check"] = {"steps": replay.pool_checked, "mismatches": 1, "first_mismatch": str(e)}
        save("replay failed")
        raise
    guards = replay.guard_slots_untouched()
    record["pool_check"] = {"steps": replay.pool_checked, "mismatches": 0 if not guards else 1,
                            "write_req_to_token_steps": replay.step, "triton_steps": replay.triton_checked,
                            "guard_slots": "untouched" if not guards else f"written: {', '.join(guards)}"}
    record["replay"] = {"steps": replay.step, "measured": len(replay.rows), "stopped": replay.stopped,
                        "warmup_s": round(replay.warmup_s, 3), "step_table_equal": True,
                        "timer": "synthetic" if truth is not None else ("cuda events" if info["type"] == "cuda"
                                                                          else "cpu wall")}
    steps = pd.DataFrame(replay.rows, columns=list(STEP_FIELDS))
    if outdir is not None:
        outdir.write("replay_steps.csv", lambda p: device_run.steps.to_csv(p, index=False))
        outdir.write("steps.csv", lambda p: steps.to_csv(p, index=False))
    save("replay")
    if guards:
        raise PoolMismatch(replay.step, " and ".join(guards), "guard slots were written")
    log(f"replay: {replay.step:,} steps, pools equal at every step; {len(replay.rows):,} measured"
        + (f" ({replay.stopped})" if replay.stopped else ""))
    if not replay.rows:
        raise ValueError("no step was measured (raise --max-steps / --budget-s)")

    meas = steps["measured_s"].to_numpy()
    held = heldout_mask(len(meas))
    too_few = int((~held).sum()) < MIN_STEPS_PER_COEFFICIENT * len(fittable())
    if refit and too_few:
        coeffs, fit_info = start, {"fitted": [], "note": f"{int((~held).sum())} training steps: too few to fit "
                                   f"{len(fittable())} coefficients (need {MIN_STEPS_PER_COEFFICIENT} per coefficient)"}
        log(f"fit skipped: {fit_info['note']}")
    elif refit:
        result = fit(cost, replay.shapes, meas, start=start, train=~held)
        coeffs = result.coefficients
        fit_info = {"fitted": result.fitted, "fixed_not_identifiable": result.fixed, "iterations": result.iterations,
                    "start": dataclasses.asdict(start)}
    else:
        coeffs, fit_info = start, {"fitted": [], "note": "validation: coefficients from the file, not refitted"}
    pred = predict(cost, coeffs, replay.shapes)
    steps["fitted_s"] = pred
    steps["error"] = pred / meas - 1
    fit_info.update(fit_report(steps["kind"], pred, meas, held))
    fit_info["before"] = fit_report(steps["kind"], steps["predicted_s"], meas, held)
    if truth is not None:
        fit_info["recovery"] = {n: getattr(coeffs, n) / getattr(truth, n) - 1 for n in fit_info["fitted"]}
    record["coefficients"] = dataclasses.asdict(coeffs)
    record["fit"] = fit_info
    if outdir is not None:
        outdir.write("steps.csv", lambda p: steps.to_csv(p, index=False))
        outdir.write_text("report.md", report_text(record))
        _plot(outdir, steps)
    save("done")
    return record


def report_text(record: dict) -> str:
    f, d = record["fit"], record["device"]

    def pct(x):
        return "-" if x is None else f"{x:.2%}"

    lines = [f"# poolsim calibration: {record['model']} on {d.get('name')} ({d['device']})", "",
             f"date {record['date']}, commit {record['commit']}, torch {d['torch']}, triton {d['triton']}, "
             f"fla-core {d['fla_core']}", ""]
    if record["fixture_only"]:
        lines += ["**Test fixture**: measured times come from a synthetic timer (known coefficients + noise); "
                  "this is not a GPU calibration.", ""]
    lines += [f"steps replayed {record['replay']['steps']}, measured {record['replay']['measured']}; "
              f"pool check: {record['pool_check']['steps']} steps, {record['pool_check']['mismatches']} mismatches",
              f"layers run {record['layers']['run']} of {record['layers']['model_layers']} ({record['layers']['spec']})",
              "", "| | before fit | after fit |", "| --- | --- | --- |",
              f"| MAPE train | {pct(f['before']['mape_train'])} | {pct(f['mape_train'])} |",
              f"| MAPE held-out | {pct(f['before']['mape_heldout'])} | {pct(f['mape_heldout'])} |",
              f"| p90 abs error | {pct(f['before']['p90_abs_error'])} | {pct(f['p90_abs_error'])} |"]
    for k, s in f["by_kind"].items():
        lines.append(f"| {k} (n={s['n']}) MAPE | {pct(f['before']['by_kind'][k]['mape'])} | {pct(s['mape'])} |")
    e2e = f["end_to_end"]
    lines += ["", f"end to end: predicted {e2e['predicted_s']:.4g} s, measured {e2e['measured_s']:.4g} s "
              f"({pct(e2e['error'])})", "", "coefficients: " + ", ".join(
                  f"{k} {v:.4g}" for k, v in record["coefficients"].items()),
              f"fitted: {', '.join(f['fitted']) or '-'}; not identifiable here: "
              f"{', '.join(f.get('fixed_not_identifiable', [])) or '-'}", "", "![predicted vs measured](calibration.png)", ""]
    return "\n".join(lines)


def _plot(outdir: OutputDir, steps) -> None:
    try:
        import matplotlib
    except ImportError:  # a device without matplotlib still gets the numbers
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    for kind, g in steps.groupby("kind"):
        ax.scatter(g["measured_s"] * 1e3, g["fitted_s"] * 1e3, s=8, label=kind)
    hi = float(max(steps["measured_s"].max(), steps["fitted_s"].max()) * 1e3 * 1.05)
    ax.plot([0, hi], [0, hi], color="grey", lw=1)
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("model step time (ms)")
    ax.legend()
    fig.tight_layout()
    outdir.write("calibration.png", lambda p: fig.savefig(p, format="png", dpi=100))
    plt.close(fig)


def describe(path: str | Path) -> str:
    """One line for ``run --calibration``: where the coefficients came from."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return f"calibration {path}"
    dev = (data.get("device") or {}) if isinstance(data, dict) else {}
    text = f"step time calibrated from {path}"
    if isinstance(dev, dict) and dev.get("name"):
        text += f" ({dev['name']}, {data.get('date', 'undated')})"
    if data.get("fixture_only"):
        text += ": a CPU test fixture, not a GPU measurement"
    return text
