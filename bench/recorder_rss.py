"""Benchmark (not a test): peak memory of a long run. Generates a synthetic trace of N requests (poolsim's
generator: 4-turn chats, short prompts, so many steps per request) and simulates it on Llama-3.1-8B / H100,
printing CPU seconds, steps, the recorder's share and peak RSS. ``--root`` points at another poolsim checkout
to measure it the same way (the before/after of the columnar recorder). ``--cli DIR``: instead, the whole of
``poolsim run TRACE --out DIR`` in this process (simulate, tables, summary, HTML report and figures), as a user
runs it; ``--table-format`` is passed on when given.

    python bench/recorder_rss.py [--requests 200000] [--root DIR] [--out DIR | --cli DIR [--table-format F]]
"""

from __future__ import annotations

import argparse
import importlib
import resource
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="the poolsim checkout to run")
    ap.add_argument("--out", help="also write the run folder's tables here (steps.csv, requests.csv)")
    ap.add_argument("--stream", choices=("csv", "parquet"), help="stream the step table to a temporary folder "
                    "during the run (simulate(stream_dir=...); the columnar recorder only)")
    ap.add_argument("--cli", metavar="DIR", help="measure `poolsim run TRACE --out DIR` end to end instead")
    ap.add_argument("--table-format", choices=("csv", "parquet"), help="with --cli: run's --table-format")
    opts = ap.parse_args()
    sys.path.insert(0, opts.root)
    if opts.cli:
        return _cli(opts)
    from poolsim.app.run import simulate
    from poolsim.pools.hardware.gpu_catalog import get_gpu
    from poolsim.pools.model.config import ModelConfig
    from poolsim.pools.sizing.server_args import ServerArgs
    from poolsim.traces import load_trace

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        _generate(path, opts.requests)
        trace = load_trace(path)
        rss0 = _rss_mib()
        _reset_peak()
        t0 = time.process_time()
        stream = {"stream_dir": tmp, "table_format": opts.stream} if opts.stream else {}
        r = simulate(trace, ModelConfig.load("llama-3.1-8b"), get_gpu("H100"), ServerArgs(), **stream)
        cpu = time.process_time() - t0
        rss1 = _peak_mib()
        tables = (r.steps.memory_usage(deep=True).sum() + r.requests.memory_usage(deep=True).sum()) / 2**20
        if opts.out:
            from poolsim.app.output import write_run

            write_run(opts.out, r.steps, r.requests, r.summary, r.run)
        rss2 = _peak_mib()
        held = _recorder_bytes(r) if hasattr(importlib.import_module("poolsim.sim.metrics"), "Table") else None
    print(f"root {opts.root}" + (f", step table streamed as {opts.stream}" if opts.stream else ""))
    print(f"{opts.requests:,} requests, {r.summary['steps']:,} steps, {cpu:.1f} s CPU; RSS {rss0:.0f} MiB before "
          f"the run (trace loaded), peak {rss1:.0f} MiB during it, {rss2:.0f} MiB with writing; "
          f"the step and request frames: {tables:.0f} MiB")
    if held:
        print("held by the recorder during the run (the run's rows replayed, tracemalloc): "
              + ", ".join(f"{k} {v:.1f} MiB" for k, v in held.items()))


def _cli(opts) -> None:
    import os

    from typer.testing import CliRunner

    from poolsim.cli import app

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        _generate(path, opts.requests)
        cwd = os.getcwd()
        os.chdir(opts.root)  # the checkout's own bundled files, as its CLI finds them
        rss0 = _rss_mib()
        _reset_peak()
        t0 = time.process_time()
        fmt = ["--table-format", opts.table_format] if opts.table_format else []
        res = CliRunner().invoke(app, ["run", str(path), "--model", "llama-3.1-8b", "--gpu", "H100", "--quiet",
                                       "--out", str(Path(cwd, opts.cli)), *fmt])
        cpu = time.process_time() - t0
        rss1 = _peak_mib()
    if res.exit_code != 0:
        raise SystemExit(res.output)
    sizes = ", ".join(f"{f.name} {f.stat().st_size / 2**20:.1f} MiB" for f in sorted(Path(cwd, opts.cli).iterdir())
                      if f.name.startswith(("steps.", "requests.")))
    print(f"root {opts.root}; poolsim run --out {opts.cli} {' '.join(fmt)}".rstrip())
    print(f"{opts.requests:,} requests, {cpu:.1f} s CPU; RSS {rss0:.0f} MiB before the run (trace written), peak "
          f"{rss1:.0f} MiB for simulate + tables + summary + report; {sizes}")


def _recorder_bytes(r) -> dict:
    """The run's step and request rows held as a list of tuples (the old recorder) and as columnar chunks."""
    import tracemalloc

    from poolsim.sim.metrics import Table

    out = {}
    for name, frame in (("steps", r.steps), ("requests", r.requests)):
        frame = frame[[c for c in frame.columns if c not in ("ttft_s", "e2e_s", "itl_s")]]
        for layout in ("tuples", "columnar"):
            tracemalloc.start()  # rows made inside the trace, as the engine makes them during the run
            if layout == "tuples":
                held = list(frame.itertuples(index=False, name=None))
            else:
                held = Table(tuple(frame.columns))
                for row in frame.itertuples(index=False, name=None):
                    held.append(row)
                held._pack()
            out[f"{name} as {layout}"] = tracemalloc.get_traced_memory()[0] / 2**20
            tracemalloc.stop()
            del held
    return out


def _generate(path: Path, n: int) -> None:
    from typer.testing import CliRunner

    from poolsim.cli import app

    res = CliRunner().invoke(app, ["trace", "generate", str(path), "--sessions", str(n // 4), "--turns", "fixed:4",
                                   "--rate", "20", "--think-time", "5", "--system-prompt-len", "200",
                                   "--input-len", "uniform:50,300", "--output-len", "uniform:20,120"])
    if res.exit_code != 0:
        raise SystemExit(res.output)


def _peak_mib() -> float:
    """Peak RSS since the last _reset_peak (VmHWM), else since the process started."""
    try:
        return _status("VmHWM")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_mib() -> float:
    return _status("VmRSS")


def _status(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024


def _reset_peak() -> None:
    try:  # Linux: "5" resets VmHWM to the current RSS, so the peak is the run's, not the trace generator's
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


if __name__ == "__main__":
    main()
