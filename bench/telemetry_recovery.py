"""Benchmark (not a test): a forward-pass-metrics stream from a known roofline is recovered by
``poolsim calibrate --measured``.

Per case: a bench_serving-like workload (random-ids, Poisson arrivals) through poolsim's scheduler; each step's
composition as SGLang's ForwardPassMetrics states it, its time the step-time model at known coefficients (the
coefficients those steps resolve, moved from the defaults by known factors: kernels.calibrate.synthetic_truth) times
log-normal noise of 3 %, written as ``poolsim record`` writes a server's messages (telemetry/synthetic.py). Then
``poolsim calibrate --measured FILE --model M --gpu G --tp N --out DIR`` (its own process) fits it. Printed: the
steps, each fitted coefficient against the truth with its standard error, and the held-out (blocks 2 and 6 of 8
contiguous blocks) step-time median |error|. Target: <= 5 %.

    python bench/telemetry_recovery.py [--noise 0.03] [--prompts 400]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

TARGET_PCT = 5.0
# model, GPU, tp, random-ids input / output length, range ratio, request rate (req/s)
CASES = [("llama-3.1-8b", "h200", 1, 4096, 256, 0.05, 8.0),
         ("qwen3-30b-a3b", "h100", 2, 2048, 256, 0.1, 12.0),
         ("kimi-linear-48b-a3b", "h200", 1, 8192, 128, 0.1, 4.0)]


def one_case(case, prompts: int, noise: float, seed: int, workdir: Path) -> dict:
    from poolsim.kernels import calibrate as cal
    from poolsim.pools.hardware.gpu_catalog import get_gpu
    from poolsim.pools.model.config import ModelConfig
    from poolsim.pools.sizing.server_args import ServerArgs
    from poolsim.sim import step_time
    from poolsim.telemetry import read_fpm
    from poolsim.telemetry.fit import cost_of
    from poolsim.telemetry.synthetic import synthetic_stream, write_jsonl
    from poolsim.traces.bench_serving import bench_requests

    name, gpu_name, tp, isl, osl, ratio, rate = case
    model, gpu, args = ModelConfig.load(name), get_gpu(gpu_name), ServerArgs(tp_size=tp)
    trace = bench_requests("random-ids", prompts, input_len=isl, output_len=osl, range_ratio=ratio,
                           request_rate=rate, vocab_size=model.vocab_size, seed=seed)
    flat = workdir / f"{name}-flat.jsonl"
    write_jsonl(synthetic_stream(trace, model, gpu, args, step_time.Coefficients(), noise=0.0), flat)
    cost, _ = cost_of(model, gpu, args)
    truth = cal.synthetic_truth(cal.resolvable(cost, read_fpm(flat).steps, step_time.Coefficients())[0])
    stream = workdir / f"{name}.jsonl"
    write_jsonl(synthetic_stream(trace, model, gpu, args, truth, noise=noise, seed=seed + 1), stream)
    out = workdir / f"{name}-cal"
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "poolsim.cli", "calibrate", "--measured", str(stream), "--model", name,
           "--gpu", gpu_name, "--tp", str(tp), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    rec = json.loads((out / "calibration.json").read_text())
    f = rec["fit"]
    return {"case": f"{name} {gpu_name} tp{tp}", "steps": f["n"], "heldout": f["n_heldout"],
            "by_kind": {k: v["n"] for k, v in f["by_kind"].items()},
            "fitted": {n: (rec["coefficients"][n], getattr(truth, n), f["rel_se"].get(n)) for n in f["fitted"]},
            "heldout_error_pct": f["heldout_error_pct"], "wall_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--noise", type=float, default=0.03, help="log-normal sigma of the measured times")
    ap.add_argument("--prompts", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="poolsim-telemetry-") as tmp:
        for case in CASES:
            r = one_case(case, a.prompts, a.noise, a.seed, Path(tmp))
            e = r["heldout_error_pct"]
            worst = max(worst, e["median_abs"])
            print(f"{r['case']}: {r['steps']} steps {r['by_kind']}, {r['heldout']} held out; "
                  f"calibrate --measured {r['wall_s']:.1f} s")
            for n, (fit, true, se) in r["fitted"].items():
                print(f"  {n:<28} fitted {fit:.4g}  truth {true:.4g}  ({fit / true - 1:+.2%}, se {se:.1%})")
            print(f"  held-out step time: median |error| {e['median_abs']:.2f} %, p90 {e['p90_abs']:.2f} %, "
                  f"median signed {e['median_signed']:+.2f} %")
    print(f"worst held-out median |error| {worst:.2f} % (target <= {TARGET_PCT:g} % at {a.noise:.0%} noise): "
          + ("met" if worst <= TARGET_PCT else "NOT met"))


if __name__ == "__main__":
    main()
