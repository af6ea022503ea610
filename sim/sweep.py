"""A grid of server configurations over one trace, in parallel: which is the cheapest that meets the SLO?

Each configuration is the base flags with some replaced (``tp=1,2,4`` x ``gpu=H100,H200`` x ...). Every
worker process loads the trace itself and returns one summary row; a configuration SGLang would refuse
(weights that do not fit, tp not dividing heads) is a row with its error, not a failed sweep.
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ProcessPoolExecutor

import pandas as pd

from pools.server_args import ServerArgs

# Flags a grid may vary besides ServerArgs fields.
EXTRA_AXES = {"gpu": str, "model": str}


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


def expand(base: dict, grid: dict[str, list]) -> list[dict]:
    """Every combination of the grid applied over the base flags (``base`` holds model, gpu and ServerArgs)."""
    names = list(grid)
    return [{**base, **dict(zip(names, combo))} for combo in itertools.product(*(grid[n] for n in names))]


def label(config: dict, grid: dict[str, list]) -> str:
    return " ".join(f"{n.replace('_size', '')}={config[n]}" for n in grid) or "base"


def _run_one(job: tuple) -> dict:
    from pools.gpu_catalog import get_gpu
    from pools.model_config import ModelConfig
    from sim.run import simulate
    from traces import load_trace

    trace_path, config, name, gpu_cost, run_opts = job
    args = {k: v for k, v in config.items() if k not in ("model", "gpu")}
    row = {"label": name, "model": config["model"], "gpu": config["gpu"], **args}
    try:
        gpu = get_gpu(config["gpu"])
        r = simulate(load_trace(trace_path), ModelConfig.load(config["model"]), gpu, ServerArgs(**args),
                     **run_opts)
    except (ValueError, RuntimeError) as e:
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
              workers: int | None = None, run_opts: dict | None = None, progress=None) -> pd.DataFrame:
    configs = expand(base, grid)
    jobs = [(trace_path, c, label(c, grid), gpu_cost or {}, run_opts or {}) for c in configs]
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    rows = []
    if workers == 1:
        for job in jobs:
            rows.append(_run_one(job))
            if progress:
                progress(len(rows), len(jobs))
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for row in pool.map(_run_one, jobs):
                rows.append(row)
                if progress:
                    progress(len(rows), len(jobs))
    return pd.DataFrame(rows)


def cheapest_meeting(sweep: pd.DataFrame, slo_p99_s: float, metric: str = "e2e") -> pd.Series | None:
    """The cheapest configuration (by cost, else by GPU count) whose p99 latency (``e2e`` or ``ttft``) meets
    the SLO with no aborts; ties go to the higher throughput."""
    column = {"e2e": "p99_latency_s", "ttft": "p99_ttft_s"}[metric]
    ok = sweep[(sweep["error"] == "") & (sweep["aborted"] == 0) & (sweep[column] <= slo_p99_s)]
    if ok.empty:
        return None
    key = "cost" if "cost" in ok.columns and ok["cost"].notna().all() else "gpus"
    return ok.sort_values([key, "throughput_tok_s"], ascending=[True, False]).iloc[0]
