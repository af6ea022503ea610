"""Benchmark (not a test): the whole Mooncake conversation trace through the simulator, radix cache on,
for Kimi-Linear-48B-A3B (H200, tp 1) and Llama-3.1-70B (H100, tp 8), and the same two on a 4x trace (four
copies of the trace one after the other, each with fresh segment ids so no copy shares a prefix with
another). Each run is its own process, so its peak RSS is its own. Prints CPU and wall seconds (the trace
load included), simulated requests and scheduler steps per CPU second, peak RSS, and hashes of the step and
request tables (equal hashes before and after a speed change = identical outputs), which core ran
(``compiled``: the mypyc build of setup.py; ``Python``: none, or POOLSIM_PURE_PYTHON=1 set to compare), and
``warm s``: the same whole-trace run again in the same process (trace load and simulation, no imports: what each
further configuration costs a sweep worker; its step table must hash the same).

    python bench/sim_mooncake.py [TRACE] [--no-x4]
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as cli.py sets it for `poolsim`: no idle BLAS threads spinning

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = [("kimi-linear-48b-a3b", "H200", 1), ("llama-3.1-70b", "H100", 8)]
DEFAULT_TRACE = str(ROOT.parent / "shared/traces/mooncake_conversation_trace.jsonl")  # beside the repo
COPY_ID_STRIDE = 1 << 38  # segment-id offset per copy: Mooncake block ids are far below it, 4 copies stay < 2**42


def four_times(trace):
    """Four back-to-back copies; copy k's segment ids are shifted by k * COPY_ID_STRIDE and its arrivals by
    k * (the trace's span + 1 s)."""
    from poolsim.traces import Trace

    reqs = list(trace)
    span = max(r.arrival_s for r in reqs) + 1.0
    copies = [dataclasses.replace(r, arrival_s=r.arrival_s + k * span,
                                  segments=tuple((s + k * COPY_ID_STRIDE, n) for s, n in r.segments))
              for k in range(4) for r in reqs]
    return Trace.from_requests(copies, name=f"{trace.name}[4 copies]", format=trace.format)


def run_one(path: str, case: int, x4: bool) -> dict:
    t_cpu, t_wall = time.process_time(), time.perf_counter()
    from poolsim.app.run import simulate
    from poolsim.compiled import compiled_modules
    from poolsim.pools.hardware.gpu_catalog import get_gpu
    from poolsim.pools.model.config import ModelConfig
    from poolsim.pools.sizing.server_args import ServerArgs
    from poolsim.traces import load_trace

    name, gpu, tp = CASES[case]
    trace = load_trace(path)
    if x4:
        trace = four_times(trace)
    r = simulate(trace, ModelConfig.load(name), get_gpu(gpu), ServerArgs(tp_size=tp))
    cpu, wall = time.process_time() - t_cpu, time.perf_counter() - t_wall
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    s = r.summary
    sha = lambda df: hashlib.sha256(df.to_csv(index=False).encode()).hexdigest()[:12]  # noqa: E731
    out = {"model": name, "gpu": gpu, "tp": tp, "x4": x4, "requests": s["requests"], "steps": s["steps"],
           "cpu_s": cpu, "wall_s": wall, "rss_gib": rss, "retracted": s["retractions"], "steps_sha": sha(r.steps),
           "requests_sha": sha(r.requests), "compiled": bool(compiled_modules()), "warm_cpu_s": None}
    if not x4:  # the same run again in this process, as a sweep worker runs its next configuration: no imports
        del r, trace
        t_cpu = time.process_time()
        again = simulate(load_trace(path), ModelConfig.load(name), get_gpu(gpu), ServerArgs(tp_size=tp))
        out["warm_cpu_s"] = time.process_time() - t_cpu
        if sha(again.steps) != out["steps_sha"]:
            raise SystemExit(f"error: {name}: a second run in the same process gave another step table")
    return out


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--one":
        print(json.dumps(run_one(argv[1], int(argv[2]), argv[3] == "x4")))
        return
    x4 = "--no-x4" not in argv
    paths = [a for a in argv if not a.startswith("--")]
    path = paths[0] if paths else DEFAULT_TRACE
    if not Path(path).is_file():
        raise SystemExit(f"error: {path}: no such trace file")
    print(f"trace {path}")
    print(f"{'model':<20} {'gpu':<4} {'tp':>2} {'trace':>5} {'requests':>8} {'steps':>7} {'CPU s':>6} {'wall s':>6} "
          f"{'req/CPU s':>9} {'steps/CPU s':>11} {'RSS GiB':>7} {'retr':>4} {'core':>8} {'warm s':>6}  "
          "steps/requests sha")
    for scale in ["x1", "x4"] if x4 else ["x1"]:
        for case in range(len(CASES)):
            out = subprocess.run([sys.executable, __file__, "--one", path, str(case), scale],
                                 capture_output=True, text=True, check=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(f"{r['model']:<20} {r['gpu']:<4} {r['tp']:>2} {scale:>5} {r['requests']:>8,} {r['steps']:>7,} "
                  f"{r['cpu_s']:>6.1f} {r['wall_s']:>6.1f} {r['requests'] / r['cpu_s']:>9,.0f} "
                  f"{r['steps'] / r['cpu_s']:>11,.0f} {r['rss_gib']:>7.2f} {r['retracted']:>4} "
                  f"{'compiled' if r['compiled'] else 'Python':>8} "
                  f"{'-' if r['warm_cpu_s'] is None else format(r['warm_cpu_s'], '.1f'):>6}  "
                  f"{r['steps_sha']}/{r['requests_sha']}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
