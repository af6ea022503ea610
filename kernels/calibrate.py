"""``poolsim calibrate`` and ``poolsim validate``: replay a trace on a device, fit the step-time coefficients,
write the calibration file that ``poolsim run --calibration`` reads.

Phases (``calibration.json`` is rewritten after each, so a run cut short leaves a valid partial file):
  plan       sizes and versions recorded
  reference  the numpy simulation, one pool digest per step (kernels.replay.ReferenceRun)
  replay     the same simulation with the pools on the device, each step checked against the reference and the
             stand-in forward measured (kernels.replay.DeviceReplay); its step table must equal the reference's
  fit        the coefficients the steps resolve, by bounded least squares on log error (``fit``),
             MAPE on train steps and on held-out contiguous blocks
The fit treats ``AnalyticStepTime(cost, coefficients)(shape)`` as a black box over the coefficients a device can
inform (``candidates``): those of its GPU architecture (the catalog GPU's ``arch``) and the architecture-independent
ones that enter a step's time, each with a range in ``sim.step_time.FIT_BOUNDS``. Other architectures' coefficients
and ``request_cpu_s`` (not step time) stay as they are. Of the candidates, the data decides which it resolves
(``identifiable``: no effect on any step, or collinear with the others on these steps, stays fixed); the file lists
every fixed coefficient with why.
On a CPU (``--device cpu --tiny``) the measurement is a synthetic timer whose known coefficients are the resolvable
ones moved by known factors, plus noise: the result is a test fixture (``fixture_only: true``), never a GPU
calibration.
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

from poolsim.pools.hardware.gpu_catalog import ARCHS
from poolsim.sim import step_time

FORMAT = "poolsim-calibration/1"
HELDOUT_BLOCKS = (2, 6)  # of 8 contiguous blocks of the measured steps
NUM_BLOCKS = 8
MIN_STEPS_PER_COEFFICIENT = 4  # fewer training steps than this per coefficient the steps resolve: no fit
SENSITIVITY_MIN = 1e-3  # a coefficient whose d log t / d log c stays below this on every step is not identifiable
# A coefficient whose sensitivity column keeps less than this share of its norm once the columns of the more
# informative coefficients are projected out moves the predictions only as a mix of theirs: collinear, not fitted.
COLLINEAR_MIN = 0.05
OUTPUT_FILES = ("calibration.json", "steps.csv", "replay_steps.csv", "report.md", "calibration.png")
# Coefficients a step replay cannot inform, whatever the device.
REPEAT_AGREE = 0.03  # two runs agree when every per-kind median step time and fitted coefficient is within 3 %
NOT_STEP_TIME = {
    "request_cpu_s": "a per-request delay in the engine (HTTP, tokenizer, admission, detokenizer) before the "
                     "scheduler sees a request, not part of any step's time: a step replay cannot measure it",
}


def fit_bounds() -> dict[str, tuple[float, float]]:
    return dict(step_time.FIT_BOUNDS)


def arch_of(name: str) -> str | None:
    """The GPU architecture a coefficient belongs to (its name's suffix), None for an architecture-independent one."""
    suffix = name.rsplit("_", 1)[-1]
    return suffix if suffix in ARCHS else None


def candidates(arch: str) -> tuple[list[str], dict[str, str]]:
    """The coefficients a device of ``arch`` can inform (its architecture's and the architecture-independent ones
    that enter a step's time, in ``Coefficients`` order), and every other one with why it stays fixed."""
    bounds, names, fixed = fit_bounds(), [], {}
    for n in step_time.Coefficients.names():
        if n in NOT_STEP_TIME:
            fixed[n] = NOT_STEP_TIME[n]
        elif n not in bounds:
            fixed[n] = "no fit range in sim.step_time.FIT_BOUNDS"
        elif arch_of(n) not in (None, arch):
            fixed[n] = f"a {arch_of(n)} coefficient; this device's steps run on {arch}"
        else:
            names.append(n)
    return names, fixed


# ------------------------------------------------------------------------------------------------- fit
def predict(cost, coefficients, shapes) -> np.ndarray:
    """The model's time for each step: a replayed batch (StepShape), or a measured step given by the model's own
    aggregates (``time_args``: poolsim.telemetry's MeasuredStep, from a real server's telemetry)."""
    model = step_time.AnalyticStepTime(cost, coefficients)
    return np.array([model.time_of(*s.time_args) if hasattr(s, "time_args") else model(s) for s in shapes],
                    dtype=float)


@dataclasses.dataclass
class FitResult:
    coefficients: object  # step_time.Coefficients
    fitted: list[str]  # identifiable: moved by the data
    fixed: dict[str, str]  # every other coefficient (kept at its starting value) and why
    iterations: int
    # relative standard error of each fitted coefficient (the fit is in log space, so the log's standard error):
    # how precisely these steps pin it, from the residual variance and the sensitivities at the solution
    rel_se: dict[str, float] = dataclasses.field(default_factory=dict)


def identifiable(J: np.ndarray, names: list[str]) -> tuple[list[str], dict[str, str]]:
    """Which columns of the sensitivity matrix ``J`` (steps x coefficients, d log t / d log c) the data can
    resolve: a column that is nil on every step is not; the others are taken most informative first (largest
    norm left after projecting out those already taken, pivoted Gram-Schmidt), and a column left with less than
    COLLINEAR_MIN of its norm is collinear with the ones taken."""
    peak = np.abs(J).max(axis=0) if len(J) else np.zeros(len(names))
    norms = np.linalg.norm(J, axis=0)
    fixed = {names[j]: f"no effect on these steps (|d log t / d log c| <= {peak[j]:.1g})"
             for j in range(len(names)) if peak[j] < SENSITIVITY_MIN}
    left = [j for j in range(len(names)) if peak[j] >= SENSITIVITY_MIN]
    basis: list[np.ndarray] = []
    taken: list[int] = []
    while left:
        resid = {j: J[:, j] - sum((q @ J[:, j]) * q for q in basis) for j in left}
        for j in [j for j in left if np.linalg.norm(resid[j]) < COLLINEAR_MIN * norms[j]]:
            cos = [abs(J[:, j] @ J[:, t]) / (norms[j] * norms[t]) for t in taken]
            partner = names[taken[int(np.argmax(cos))]]
            fixed[names[j]] = (f"collinear on these steps with {partner} (and the others fitted): "
                               f"{np.linalg.norm(resid[j]) / norms[j]:.1%} of its effect is its own")
            left.remove(j)
        if not left:
            break
        j = max(left, key=lambda j: np.linalg.norm(resid[j]))
        basis.append(resid[j] / np.linalg.norm(resid[j]))
        taken.append(j)
        left.remove(j)
    return [n for j, n in enumerate(names) if j in taken], fixed


def sensitivity(cost, shapes, k, names) -> np.ndarray:
    """d log t / d log c on each step (rows) for each named coefficient (columns), at coefficients ``k``."""
    x = np.log([getattr(k, n) for n in names])
    base = np.log(predict(cost, k, shapes))
    return _jacobian(lambda x: _residual(cost, shapes, base, k, names, x), x)


def resolvable(cost, shapes, start) -> tuple[list[str], dict[str, str]]:
    """The coefficients these steps can inform at ``start`` (the device's candidates the data resolves), and
    every other coefficient with why it stays fixed. Needs only the step shapes, not the measurements."""
    names, fixed = candidates(cost.arch)
    active, unresolved = identifiable(sensitivity(cost, shapes, start, names), names)
    return active, {**fixed, **unresolved}


def fit(cost, shapes, measured, start=None, train=None, max_iter: int = 60, rounds: int = 3,
        only: list[str] | None = None) -> FitResult:
    """Bounded Levenberg-Marquardt on ``log(predicted) - log(measured)`` over the log of the identifiable
    coefficients of the device's architecture (bounds: clipping in log space), forward-difference Jacobian of
    the black-box model. Identifiability is decided on the training steps at the starting point and checked again
    at the solution; a coefficient that loses it there goes back to its start and the rest is refitted. ``only``
    limits the fit to those coefficients (a repeat run refits what the first run fitted, so the two compare)."""
    start = start or step_time.Coefficients()
    measured = np.asarray(measured, dtype=float)
    idx = np.arange(len(shapes)) if train is None else np.flatnonzero(train)
    sub = [shapes[i] for i in idx]
    logm = np.log(measured[idx])
    active, fixed = resolvable(cost, sub, start)
    if only is not None:
        fixed.update({n: "not fitted by the first run (kept to compare the two fits)" for n in active if n not in only})
        active = [n for n in active if n in only]
    unresolved: dict[str, str] = {}
    result, it = start, 0
    for _ in range(rounds):
        result, n_it = _levenberg_marquardt(cost, sub, logm, start, active, max_iter)
        it += n_it
        still, lost = identifiable(sensitivity(cost, sub, result, active), active) if active else ([], {})
        if not lost:
            break
        unresolved.update({n: f"{why} (at the fitted values)" for n, why in lost.items()})
        active = still
    else:  # the last round still lost some: fit what is left once more
        result, n_it = _levenberg_marquardt(cost, sub, logm, start, active, max_iter)
        it += n_it
    fixed.update(unresolved)
    result = dataclasses.replace(result, **{n: getattr(start, n) for n in unresolved})
    return FitResult(result, active, {n: fixed[n] for n in step_time.Coefficients.names() if n in fixed}, it,
                     standard_errors(cost, sub, logm, result, active))


def standard_errors(cost, shapes, logm, k, names) -> dict[str, float]:
    """Least-squares standard errors of the log coefficients: ``sqrt(diag(s^2 (J^T J)^-1))`` with ``J`` the
    sensitivities d log t / d log c at ``k`` and ``s^2`` the residual variance over n - p degrees of freedom. A
    coefficient the steps pin only together with another (a few prefills shared by two prefill terms) shows a
    large one even when the fit is good."""
    if not names or len(shapes) <= len(names):
        return {}
    J = sensitivity(cost, shapes, k, names)
    r = np.log(predict(cost, k, shapes)) - logm
    s2 = float(r @ r) / (len(shapes) - len(names))
    cov = s2 * np.linalg.pinv(J.T @ J)
    return {n: float(np.sqrt(max(cov[i, i], 0.0))) for i, n in enumerate(names)}


def _residual(cost, shapes, logm, start, names, x):
    k = dataclasses.replace(start, **{n: float(np.exp(v)) for n, v in zip(names, x)})
    return np.log(predict(cost, k, shapes)) - logm


def _jacobian(residual, x, h=1e-6):
    r = residual(x)
    cols = []
    for j in range(len(x)):
        xh = x.copy()
        xh[j] += h
        cols.append((residual(xh) - r) / h)
    return np.stack(cols, axis=1) if cols else np.zeros((len(r), 0))


def _levenberg_marquardt(cost, shapes, logm, start, names, max_iter):
    bounds = fit_bounds()
    if not names:
        return start, 0
    lo = np.log([bounds[n][0] for n in names])
    hi = np.log([bounds[n][1] for n in names])

    def residual(x):
        return _residual(cost, shapes, logm, start, names, x)

    x = np.clip(np.log([getattr(start, n) for n in names]), lo, hi)
    r = residual(x)
    cost_now = float(r @ r)
    lam, it = 1e-3, 0
    for it in range(1, max_iter + 1):
        J = _jacobian(residual, x)
        A, g = J.T @ J, J.T @ r
        improved = done = False
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
    return dataclasses.replace(start, **{n: float(np.exp(v)) for n, v in zip(names, x)}), it


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


# ------------------------------------------------------------------------------------------------- two runs agree
def run_summary(kinds, measured, fit_kinds, fitted_pred, coefficients: dict) -> dict:
    """What a repeat is compared on: per step kind, the median measured step time (``kinds``, ``measured``: this
    run's steps) and the total of the fitted model's predictions over the first run's steps (``fit_kinds``,
    ``fitted_pred``, so two fits are compared on the same steps); and the fitted coefficients."""
    kinds, measured = np.asarray(kinds), np.asarray(measured, float)
    fit_kinds, fitted_pred = np.asarray(fit_kinds), np.asarray(fitted_pred, float)
    return {"median_step_s": {k: float(np.median(measured[kinds == k])) for k in sorted(set(kinds.tolist()))},
            "fitted_total_s": {k: float(fitted_pred[fit_kinds == k].sum()) for k in sorted(set(fit_kinds.tolist()))},
            "coefficients": dict(coefficients)}


def compare_runs(first: dict, other: dict, threshold: float = REPEAT_AGREE) -> dict:
    """Relative differences ``|other / first - 1|`` between two ``run_summary``s. The runs agree when every per-kind
    median step time (the measurement) and every per-kind total of the fitted model's predictions (what the fit
    says) is within ``threshold``. Each fitted coefficient's difference is reported too but does not decide: a
    coefficient the steps pin down weakly (a few prefills) moves several times more than the predictions do."""
    decide, coeffs = {}, {}
    for group, label, into in (("median_step_s", "median {} step", decide), ("fitted_total_s", "fitted {} total",
                                                                             decide), ("coefficients", "{}", coeffs)):
        for name, a in first[group].items():
            b = other[group].get(name)
            if b is not None and a:
                into[label.format(name)] = {"first": a, "repeat": b, "rel_diff": abs(b / a - 1)}
    worst = max(decide, key=lambda n: decide[n]["rel_diff"]) if decide else None
    top = decide[worst]["rel_diff"] if worst else None
    return {"threshold": threshold, "compared": decide, "max_rel_diff": top, "worst": worst,
            "agree": top is not None and top <= threshold, "coefficients": coeffs,
            "coefficients_max_rel_diff": max((c["rel_diff"] for c in coeffs.values()), default=None)}


# ------------------------------------------------------------------------------------------------- synthetic timer
def synthetic_truth(names: list[str]):
    """Known coefficients for the CPU path: each named coefficient (those the steps can inform, ``resolvable``)
    moved from its default by a fixed factor, kept in bounds. The others stay at their defaults, which is where
    the fit keeps them: moving one the steps cannot resolve would only shift its collinear partners."""
    base, bounds = step_time.Coefficients(), fit_bounds()
    factors = (0.8, 1.25, 1.6, 0.7, 1.4)
    moved = {}
    for i, n in enumerate(names):
        lo, hi = bounds[n]
        value, f = getattr(base, n), factors[i % len(factors)]
        moved[n] = value * f if lo <= value * f <= hi else value / f  # the other way where f leaves the bounds
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


# ------------------------------------------------------------------------------------------------- device memory
MEMORY_HEADROOM = 0.9  # of the available memory the estimate may take (the rest: the process, allocator slack)


def available_bytes(device: str) -> int | None:
    """Free memory on ``device``: ``torch.cuda.mem_get_info`` on CUDA, ``MemAvailable`` of /proc/meminfo on a CPU;
    None where it cannot be read (then nothing is checked)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return None


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_memory(estimate: dict[str, int], device: str) -> dict:
    """The estimate against the device's free memory; a ValueError (one line: the estimate and its largest parts,
    what is available, what to shrink) when it exceeds MEMORY_HEADROOM of it. Returns what is recorded."""
    total, available = sum(estimate.values()), available_bytes(device)
    record = {"estimate_bytes": total, "parts_bytes": dict(estimate), "available_bytes": available,
              "headroom": MEMORY_HEADROOM}
    if available is not None and total > MEMORY_HEADROOM * available:
        parts = ", ".join(f"{name} {_gib(n)}" for name, n in sorted(estimate.items(), key=lambda kv: -kv[1])[:3])
        raise ValueError(f"--device {device}: the replay would allocate about {_gib(total)} ({parts}) but "
                         f"{_gib(available)} is available; shrink it: --max-total-tokens (the KV pool, its free "
                         "lists), --layers unit or fewer per kind (pools and weights), --max-running-requests or "
                         "--context-length (req_to_token), or a shorter trace (the largest step)")
    return record


# ------------------------------------------------------------------------------------------------- output folder
class OutputDir:
    """Files poolsim writes here, each replaced atomically; a folder holding anything else is refused."""

    def __init__(self, path: str | Path, files: tuple[str, ...] = OUTPUT_FILES, writer: str | None = None):
        """``files``: the names this folder may hold (calibrate's by default); ``writer``: the command that writes
        them, named when a folder holds anything else (a file another poolsim command wrote is refused too)."""
        self.path = Path(path)
        if self.path.exists():
            if not self.path.is_dir():
                raise ValueError(f"--out {self.path}: exists and is not a folder")
            # a killed run's half-written ``.NAME.tmp`` is ours too: ``write`` replaces it
            ours = set(files) | {f".{n}.tmp" for n in files}
            foreign = sorted(p.name for p in self.path.iterdir() if p.name not in ours)
            if foreign:
                who = "poolsim did not write" if writer is None else f"`{writer}` does not write"
                raise ValueError(f"--out {self.path}: holds files {who} ({', '.join(foreign[:3])}); "
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
    import torch

    if torch.device(opts.device).type != "cpu":
        return _calibrate(trace, model, gpu, args, out, opts, trace_info, runtime_overhead_gib, max_new_tokens,
                          calibration, noise, refit, log)
    # On a CPU the stand-in's tensors are tiny and its times only exercise the plumbing: one intra-op thread (a
    # pool of spinning threads costs ~10x the CPU time on a shared machine), restored afterwards.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _calibrate(trace, model, gpu, args, out, opts, trace_info, runtime_overhead_gib, max_new_tokens,
                          calibration, noise, refit, log)
    finally:
        torch.set_num_threads(threads)


def _calibrate(trace, model, gpu, args, out, opts, trace_info, runtime_overhead_gib, max_new_tokens, calibration,
               noise, refit, log) -> dict:
    import pandas as pd

    from poolsim.app.run import simulate
    from poolsim.kernels.replay import STEP_FIELDS, DeviceReplay, PoolMismatch, ReferenceRun
    from poolsim.pools.sizing.plan import plan_memory

    t0 = time.perf_counter()
    outdir = OutputDir(out) if out is not None else None
    plan = plan_memory(model, gpu, args, runtime_overhead_gib=runtime_overhead_gib)
    cost = step_time.ModelCost.from_model(model, gpu, plan, args)  # as `run` prices steps (graphs, EP)
    start = step_time.Coefficients.from_calibration(calibration) if calibration else step_time.Coefficients()
    synthetic = opts.device == "cpu" or opts.tiny  # the timer is made once the reference run gave the steps
    truth = None
    info = device_info(opts.device)
    record = {
        "format": FORMAT, "phase": "plan", "device": info,
        "fixture_only": synthetic,  # a CPU / synthetic calibration is a test fixture, never a GPU one
        "synthetic_timer": None,
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

    def new_replay(run_opts):
        return DeviceReplay(model, plan, run_opts, cuda_graph_max_bs=cost.cuda_graph_max_bs)

    replay = new_replay(opts)
    kinds: dict[str, int] = {}
    for lid, layer in enumerate(model.layers):
        kinds.setdefault(f"{layer.mixer}+{layer.mlp}", 0)
        kinds[f"{layer.mixer}+{layer.mlp}"] += 1
    record["layers"] = {"spec": opts.layers, "run": replay.layer_ids, "model_layers": len(model.layers),
                        "per_kind": kinds, "dims": dataclasses.asdict(replay.dims)}
    log(f"plan: {plan.max_total_num_tokens:,} KV tokens, {plan.max_running_requests} rows"
        + (f", {plan.max_mamba_cache_size} state slots" if plan.max_mamba_cache_size else "")
        + f"; running layers {replay.layer_ids} of {len(model.layers)} on {info['device']}")

    sim_kw = dict(trace_info=trace_info, max_new_tokens=max_new_tokens, calibration=calibration,
                  runtime_overhead_gib=runtime_overhead_gib, plan=plan)  # planned once, above
    ref = ReferenceRun()
    reference = simulate(trace, model, gpu, args, replay=ref, **sim_kw)
    # what the device run will hold, known from the plan and the reference steps: refuse now, before anything is
    # allocated or written, rather than be killed (or hit CUDA OOM) mid-run
    record["memory"] = check_memory(replay.memory_estimate(args, ref.shapes), opts.device)
    save("plan")
    if synthetic:  # known coefficients: those these steps can inform, moved by known factors
        truth = synthetic_truth(resolvable(cost, ref.shapes, start)[0])
        opts.synthetic = SyntheticTimer(cost, truth, noise, seed=opts.seed)
        record["synthetic_timer"] = {"coefficients": dataclasses.asdict(truth), "noise": noise}
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
                        "warmup_s": round(replay.warmup_s, 3),
                        "graphs": {**replay.graphs_summary(), "prefill": (
                            "eager; SGLang captures breakable prefill graphs for this model (the step-time model "
                            "prices them), the replay does not" if cost.prefill_cuda_graph else "eager, as SGLang")},
                        "step_table_equal": True,
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
    train_shapes = [s for s, h in zip(replay.shapes, held) if not h]
    names = resolvable(cost, train_shapes, start)[0] if refit else []  # what the fit would move
    if refit and len(train_shapes) < MIN_STEPS_PER_COEFFICIENT * len(names):
        coeffs, fit_info = start, {"arch": cost.arch, "fitted": [], "note": (
            f"{len(train_shapes)} training steps: too few to fit the {len(names)} coefficients they resolve "
            f"(need {MIN_STEPS_PER_COEFFICIENT} per coefficient)")}
        log(f"fit skipped: {fit_info['note']}")
    elif refit:
        result = fit(cost, replay.shapes, meas, start=start, train=~held)
        coeffs = result.coefficients
        bounds = fit_bounds()
        fit_info = {"arch": cost.arch, "fitted": result.fitted, "fixed": result.fixed, "iterations": result.iterations,
                    "rel_se": result.rel_se, "start": dataclasses.asdict(start),
                    # the data pushes these to a FIT_BOUNDS edge: the model does not fit these steps there
                    "at_bound": [n for n in result.fitted if getattr(coeffs, n) in bounds[n]]}
    else:
        coeffs, fit_info = start, {"arch": cost.arch, "fitted": [],
                                   "note": "validation: coefficients from the file, not refitted"}
    pred = predict(cost, coeffs, replay.shapes)
    steps["fitted_s"] = pred
    steps["error"] = pred / meas - 1
    fit_info.update(fit_report(steps["kind"], pred, meas, held))
    fit_info["before"] = fit_report(steps["kind"], steps["predicted_s"], meas, held)
    if truth is not None:
        fit_info["recovery"] = {n: getattr(coeffs, n) / getattr(truth, n) - 1 for n in fit_info["fitted"]}
    # only what this device speaks for (its architecture's and the architecture-independent step terms): a run on
    # another architecture, and request_cpu_s everywhere, keep the shipped defaults
    record["coefficients"] = {n: getattr(coeffs, n) for n in candidates(cost.arch)[0]}
    record["fit"] = fit_info
    if fit_info["mape_heldout"] is not None:  # what `run --calibration` quotes as this file's error
        record["measured_error"] = (f"held-out step MAPE {fit_info['mape_heldout']:.1%} over "
                                    f"{fit_info['n_heldout']} replayed steps"
                                    + (" of a synthetic timer (CPU test fixture)" if synthetic else ""))
    if outdir is not None:
        outdir.write("steps.csv", lambda p: steps.to_csv(p, index=False))
        outdir.write_text("report.md", report_text(record))
        _plot(outdir, steps)
    if opts.repeat > 1:  # the same replay again: do the measurements (and the fit) come out the same?
        first = run_summary(steps["kind"], meas, steps["kind"], pred,
                            {n: getattr(coeffs, n) for n in fit_info["fitted"]})
        record["repeat"] = {"runs": opts.repeat, "threshold": REPEAT_AGREE, "each": []}
        for r in range(1, opts.repeat):
            # the Triton checks ran in the first run (on CUDA the fused kernels run anyway)
            again_opts = dataclasses.replace(opts, triton_steps=0, synthetic=SyntheticTimer(
                cost, truth, noise, seed=opts.seed + r) if truth is not None else None)
            again = new_replay(again_opts)
            again.reference = ref.digests
            simulate(trace, model, gpu, args, replay=again, **sim_kw)  # the pools are checked again on every step
            kinds2 = [row["kind"] for row in again.rows]
            meas2 = np.array([row["measured_s"] for row in again.rows])
            coeffs2, fitted2 = coeffs, {}
            if fit_info["fitted"]:
                # the first run's fitted set: which borderline coefficient the data resolves can change with the
                # noise, and two fits of different sets would differ for that reason alone
                res2 = fit(cost, again.shapes, meas2, start=start, train=~heldout_mask(len(meas2)),
                           only=fit_info["fitted"])
                coeffs2, fitted2 = res2.coefficients, {n: getattr(res2.coefficients, n) for n in res2.fitted}
            # the second fit's predictions over the first run's steps, per kind as the first run's
            pred2 = predict(cost, coeffs2, replay.shapes)
            cmp = compare_runs(first, run_summary(kinds2, meas2, steps["kind"], pred2, fitted2))
            cmp["measured"], cmp["graphs_capture_s"] = len(again.rows), again.graphs_summary()["capture_s"]
            record["repeat"]["each"].append(cmp)
            log(f"repeat {r + 1}: max relative difference {cmp['max_rel_diff']:.2%} ({cmp['worst']}) against run 1"
                f" -> {'agree' if cmp['agree'] else 'DISAGREE'} within {REPEAT_AGREE:.0%}")
            save("repeat")
        each = record["repeat"]["each"]
        record["repeat"]["max_rel_diff"] = max(c["max_rel_diff"] for c in each)
        record["repeat"]["agree"] = all(c["agree"] for c in each)
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
              f"({pct(e2e['error'])})", "", f"coefficients ({f.get('arch', '-')} and architecture-independent): "
              + ", ".join(f"{k} {v:.4g}" for k, v in record["coefficients"].items()
                          if arch_of(k) in (None, f.get("arch"))),
              f"fitted ({f.get('arch', '-')}, with the standard error of each): "
              + (", ".join(f"{n} +-{f.get('rel_se', {}).get(n, float('nan')):.1%}" for n in f["fitted"]) or "-"), ""]
    here = {n: why for n, why in f.get("fixed", {}).items() if arch_of(n) in (None, f.get("arch"))}
    lines += [f"- {n} fixed: {why}" for n, why in here.items()]
    if f.get("at_bound"):
        lines.append(f"- at a FIT_BOUNDS edge (the model does not fit these steps there): {', '.join(f['at_bound'])}")
    others = len(f.get("fixed", {})) - len(here)
    if others:
        lines.append(f"- {others} coefficients of other GPU architectures fixed (this device cannot inform them)")
    g = (record.get("replay") or {}).get("graphs")
    if g:
        lines += ["", f"decode graphs ({g['mode']}): capture sizes {g['capture_bs']}; steps per padded size "
                  f"{g['decode_steps_per_bucket']}; capture {g['capture_s']:.3g} s (not measured)"]
    r = record.get("repeat")
    if r and "agree" in r:
        lines += ["", f"repeat: {r['runs']} runs, max relative difference {pct(r['max_rel_diff'])} "
                  f"({'agree' if r['agree'] else 'DISAGREE'} within {r['threshold']:.0%})"]
    lines += ["", "![predicted vs measured](calibration.png)", ""]
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
