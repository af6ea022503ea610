"""Benchmark (not a test): peak memory of a long run. Generates a synthetic trace of N requests (poolsim's
generator: 4-turn chats, short prompts, so many steps per request) and simulates it on Llama-3.1-8B / H100,
printing CPU seconds, steps, the recorder's share and peak RSS. ``--root`` points at another poolsim checkout
to measure it the same way (the before/after of the columnar recorder).

    python bench/recorder_rss.py [--requests 200000] [--root DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
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
    opts = ap.parse_args()
    sys.path.insert(0, opts.root)
    from pools.gpu_catalog import get_gpu
    from pools.model_config import ModelConfig
    from pools.server_args import ServerArgs
    from sim.run import simulate
    from traces import load_trace

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        _generate(path, opts.requests)
        trace = load_trace(path)
        rss0 = _peak_mib()
        t0 = time.process_time()
        stream = {"stream_dir": tmp, "table_format": opts.stream} if opts.stream else {}
        r = simulate(trace, ModelConfig.load("llama-3.1-8b"), get_gpu("H100"), ServerArgs(), **stream)
        cpu = time.process_time() - t0
        rss1 = _peak_mib()
        if opts.out:
            from sim.output import write_run

            write_run(opts.out, r.steps, r.requests, r.summary, r.run)
        rss2 = _peak_mib()
    print(f"root {opts.root}" + (f", step table streamed as {opts.stream}" if opts.stream else ""))
    print(f"{opts.requests:,} requests, {r.summary['steps']:,} steps, {cpu:.1f} s CPU; peak RSS: "
          f"{rss0:.0f} MiB before the run, {rss1:.0f} MiB after it, {rss2:.0f} MiB after writing")


def _generate(path: Path, n: int) -> None:
    from typer.testing import CliRunner

    from cli import app

    res = CliRunner().invoke(app, ["trace", "generate", str(path), "--sessions", str(n // 4), "--turns", "fixed:4",
                                   "--rate", "20", "--think-time", "5", "--system-prompt-len", "200",
                                   "--input-len", "uniform:50,300", "--output-len", "uniform:20,120"])
    if res.exit_code != 0:
        raise SystemExit(res.output)


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    main()
