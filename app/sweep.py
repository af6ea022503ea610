"""A grid of server configurations over one trace, in parallel: which is the cheapest that meets the SLO?

Each configuration is the base flags with some replaced (``tp=1,2,4`` x ``gpu=H100,H200`` x ...). Every
worker process loads the trace itself and returns one summary row; a configuration SGLang would refuse
(weights that do not fit, tp not dividing heads) is a row with its error, not a failed sweep.

Configurations run in a local process pool, or as Ray tasks (``ray=``; the ``ray`` extra): the same
``_run_one`` per configuration either way, the rows in grid order, so both give the same table.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import os
import tempfile
from pathlib import Path

import pandas as pd

from poolsim.app.signals import worker_init
from poolsim.pools.sizing.server_args import ServerArgs

# Flags a grid may vary besides ServerArgs fields.
EXTRA_AXES = {"gpu": str, "model": str}
# Result columns that are counts: integers in the table, CSV and JSON, empty where a configuration was refused.
COUNT_COLUMNS = {"gpus", "retractions", "aborted"}


def parse_grid(specs: list[str]) -> dict[str, list]:
    """``["tp=1,2", "gpu=H100,H200"]`` -> ``{"tp_size": [1, 2], "gpu": ["H100", "H200"]}``, typed by ServerArgs."""
    types = {f: type(v) if v is not None else None for f, v in ServerArgs().__dict__.items()}
    aliases = {"tp": "tp_size", "dp": "dp_size"}
    grid: dict[str, list] = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        name = aliases.get(name.strip().replace("-", "_"), name.strip().replace("-", "_"))
        if not sep or not values.strip():
            raise ValueError(f"--grid {spec!r}: expected NAME=V1,V2,...")
        if name not in types and name not in EXTRA_AXES:
            raise ValueError(f"--grid {spec!r}: {name} is not a server flag (see `poolsim run --help`)")
        if name in grid:  # the last one would silently win
            raise ValueError(f"--grid {spec!r}: {name} is given twice; list its values once (NAME=V1,V2,...)")
        grid[name] = [_convert(name, v.strip(), types.get(name)) for v in values.split(",") if v.strip()]
    return grid


def _convert(name: str, value: str, kind):
    if name in EXTRA_AXES or kind is str:
        return value
    if kind is bool:
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"--grid {name}: {value!r} is not true/false")
        return value.lower() in ("true", "1")
    try:  # unset-by-default flags (None) take numbers: ints where they parse, else floats
        return int(value) if kind is int or (kind is None and value.lstrip("-").isdigit()) else float(value)
    except ValueError:
        raise ValueError(f"--grid {name}: {value!r} is not a number") from None


def parse_gpu_cost(text: str) -> dict[str, float]:
    """``H100=2.5,H200=3.5`` -> $/GPU-hour by GPU name."""
    costs = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, sep, price = item.partition("=")
        try:
            value = float(price)
        except ValueError:
            value = math.nan
        if not sep or not name.strip() or not math.isfinite(value) or value < 0:
            raise ValueError(f"--gpu-cost {item!r}: expected GPU=PRICE with a price >= 0 ($ per GPU-hour)")
        costs[name.strip()] = value
    return costs


def base_config(flags: dict, grid: dict[str, list]) -> dict:
    """The configuration the grid varies: model, gpu and every ServerArgs field from a command's flags (custom GPUs
    and the runtime overhead are not swept). The flags are checked here, once: one error for the command, not one
    per configuration."""
    from poolsim.app.server import CUSTOM_GPU_FLAGS, load_server

    load_server({**flags, **{k: v[0] for k, v in grid.items() if k in EXTRA_AXES}})
    dropped = {*CUSTOM_GPU_FLAGS, "runtime_overhead_gib", "tp_size", "dp_size"}
    # tp_size and dp_size last: the table's columns in the order they have always had
    base = {k: v for k, v in flags.items() if k not in dropped}
    base.update(tp_size=flags["tp_size"], dp_size=flags["dp_size"])
    if base.get("gpu") is None and "gpu" not in grid:
        raise ValueError("--gpu (or --grid gpu=...) is required")
    return base


def expand(base: dict, grid: dict[str, list]) -> list[dict]:
    """Every combination of the grid applied over the base flags (``base`` holds model, gpu and ServerArgs)."""
    names = list(grid)
    return [{**base, **dict(zip(names, combo))} for combo in itertools.product(*(grid[n] for n in names))]


def label(config: dict, grid: dict[str, list]) -> str:
    return " ".join(f"{n.replace('_size', '')}={config[n]}" for n in grid) or "base"


def _run_one(job: tuple) -> dict:
    from poolsim.app.run import simulate
    from poolsim.pools.hardware.gpu_catalog import get_gpu
    from poolsim.pools.model.config import ModelConfig
    from poolsim.traces import load_trace

    trace_path, config, name, gpu_cost, run_opts = job
    run_opts = dict(run_opts)
    capacity_slo = run_opts.pop("capacity_slo", None)  # (slo_p99_s, slo_on): also search this row's capacity
    args = {k: v for k, v in config.items() if k not in ("model", "gpu")}
    row = {"label": name, "model": config["model"], "gpu": config["gpu"], **args}
    try:
        gpu = get_gpu(config["gpu"])
        model, server_args, trace = ModelConfig.load(config["model"]), ServerArgs(**args), load_trace(trace_path)
        r = simulate(trace, model, gpu, server_args, **run_opts)
        if capacity_slo is not None:
            from poolsim.app.capacity import find_capacity

            found = find_capacity(trace, model, gpu, server_args, *capacity_slo, **run_opts)
            best = found.best
            row.update(capacity_scale=found.scale, capacity_req_s=best.throughput_req_s if best else None)
    except (ValueError, RuntimeError, ArithmeticError) as e:  # one configuration's error is its row's, never the sweep's
        return {**row, "error": str(e)}
    s = r.summary
    gpus = args.get("tp_size", 1) * args.get("dp_size", 1)
    row.update(gpus=gpus, throughput_tok_s=s["output_tok_s"], throughput_req_s=s["throughput_req_s"],
               p99_latency_s=s["e2e_s"]["p99"], p99_ttft_s=s["ttft_s"]["p99"], p99_itl_s=s["itl_s"]["p99"],
               cache_hit_rate=s["cache_hit_rate"], retractions=s["retractions"], aborted=s["aborted"],
               binding_pool=s["binding_pool"], verdict=s["verdict"], error="")
    price = gpu_cost.get(gpu.name) or gpu_cost.get(config["gpu"])
    if price is not None:
        row["cost"] = gpus * price
        row["cost_per_m_output_tokens"] = (gpus * price / 3600) / (s["output_tok_s"] / 1e6) if s["output_tok_s"] else None
    return row


def run_sweep(trace_path: str, base: dict, grid: dict[str, list], gpu_cost: dict[str, float] | None = None,
              workers: int | None = None, run_opts: dict | None = None, progress=None,
              ray: bool | str = False) -> pd.DataFrame:
    """One row per configuration, in grid order. ``progress(done, total)`` counts finished configurations.

    ``ray``: run as Ray tasks instead of in the local pool. ``True``: Ray's default (the cluster in
    ``RAY_ADDRESS``, else a new local instance); a string is ``ray.init``'s address (``auto``, ``host:port``,
    ``ray://host:port``, ``local``). An already initialised Ray is used as it is and left running. Cluster nodes
    need poolsim (the same version) installed.
    """
    configs = expand(base, grid)
    jobs = [(trace_path, c, label(c, grid), gpu_cost or {}, run_opts or {}) for c in configs]
    if ray:
        rows = _run_on_ray(jobs, None if ray is True else ray, progress)
    else:
        rows = _run_local(jobs, workers, progress)
    table = pd.DataFrame(rows)
    for column in COUNT_COLUMNS.intersection(table.columns):  # counts stay integers beside refused rows (NA)
        table[column] = table[column].astype("Int64")
    return table


def _run_local(jobs: list[tuple], workers: int | None, progress) -> list[dict]:
    if workers is not None and workers < 1:
        raise ValueError(f"--workers {workers}: must be >= 1")
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    rows: list[dict | None] = [None] * len(jobs)
    if workers == 1:
        for i, job in enumerate(jobs):
            rows[i] = _run_one(job)
            if progress:
                progress(i + 1, len(jobs))
        return rows
    # The parent owns its pool: leaving the block for any reason (Ctrl-C, SIGTERM/SIGHUP through app/signals.py,
    # an error) terminates the workers instead of waiting for their running jobs.
    with multiprocessing.Pool(workers, initializer=worker_init, initargs=(os.getpid(),)) as pool:
        results = pool.imap_unordered(_run_indexed, enumerate(jobs))
        for done, (i, row) in enumerate(results, 1):  # progress as each finishes, rows in grid order
            rows[i] = row
            if progress:
                progress(done, len(jobs))
    return rows


def _run_indexed(item: tuple[int, tuple]) -> tuple[int, dict]:
    return item[0], _run_one(item[1])


def _run_on_ray(jobs: list[tuple], address: str | None, progress) -> list[dict]:
    try:
        import ray
    except ImportError:
        raise ValueError("--ray needs Ray: pip install 'poolsim[ray]'") from None
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ValueError(f"--ray-address {address or '(default)'}: cannot start or join Ray: {e}") from None
    try:
        # The trace travels as bytes through the object store: cluster nodes need not share a filesystem.
        path = Path(jobs[0][0]) if jobs else None
        blob = ray.put(path.read_bytes()) if path else None
        task = ray.remote(_run_one_shipped)
        pending = {task.remote(blob, path.name, job[1:]): i for i, job in enumerate(jobs)}
        rows: list[dict | None] = [None] * len(jobs)
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                rows[pending.pop(ready[0])] = ray.get(ready[0])
                if progress:
                    progress(len(jobs) - len(pending), len(jobs))
        except BaseException:  # interrupted (or a task failed): the tasks still queued or running are cancelled
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        return rows
    finally:
        if started:
            ray.shutdown()


def _run_one_shipped(trace_bytes: bytes, name: str, rest: tuple) -> dict:
    """``_run_one`` on a Ray worker: the trace written back to a file of the same name (its format is detected
    from the name and content, as on the driver)."""
    with tempfile.TemporaryDirectory(prefix="poolsim-sweep-") as tmp:
        path = Path(tmp) / name
        path.write_bytes(trace_bytes)
        return _run_one((str(path), *rest))


def meets_slo(sweep: pd.DataFrame, slo_p99_s: float, metric: str = "e2e") -> pd.Series:
    """True for the configurations that ran with no aborts and whose p99 latency (``e2e`` or ``ttft``) is within
    the SLO."""
    column = {"e2e": "p99_latency_s", "ttft": "p99_ttft_s"}[metric]
    return ((sweep["error"] == "") & sweep["aborted"].fillna(1).eq(0) & (sweep[column] <= slo_p99_s)).astype(bool)


def apply_slo(sweep: pd.DataFrame, slo_p99_s: float | None, metric: str = "e2e") -> str | None:
    """With an SLO and a configuration that ran: a ``meets_slo`` column (before ``error``), and the label of the
    cheapest configuration meeting the SLO (None: none does, or no SLO)."""
    if slo_p99_s is None or "p99_latency_s" not in sweep:
        return None
    best = cheapest_meeting(sweep, slo_p99_s, metric)
    sweep.insert(sweep.columns.get_loc("error"), "meets_slo", meets_slo(sweep, slo_p99_s, metric))
    return None if best is None else best["label"]


def write_sweep(folder: Path, sweep: pd.DataFrame, slo_p99_s: float | None, metric: str = "e2e") -> None:
    """sweep.csv, and frontier.png when a configuration ran (its x axis: the latency the SLO bounds)."""
    from poolsim.reports.plots import plot_frontier

    sweep.to_csv(folder / "sweep.csv", index=False)
    ok = sweep[sweep["error"] == ""] if "error" in sweep else sweep
    if len(ok):
        shown = ok.assign(p99_latency_s=ok["p99_ttft_s"]) if metric == "ttft" else ok
        plot_frontier(shown, slo_s=slo_p99_s).savefig(folder / "frontier.png", dpi=120)


def cheapest_meeting(sweep: pd.DataFrame, slo_p99_s: float, metric: str = "e2e") -> pd.Series | None:
    """The cheapest configuration (by cost, else by GPU count) that meets the SLO; ties go to the higher
    throughput."""
    ok = sweep[meets_slo(sweep, slo_p99_s, metric)]
    if ok.empty:
        return None
    key = "cost" if "cost" in ok.columns and ok["cost"].notna().all() else "gpus"
    return ok.sort_values([key, "throughput_tok_s"], ascending=[True, False]).iloc[0]
