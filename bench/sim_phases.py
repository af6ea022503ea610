"""Benchmark (not a test): where one whole-trace simulation spends its time, by scheduler phase.

Wraps the scheduler's phases (prefill preparation, decode preparation, result processing, tree checkpoints,
the waiting-queue refresh, releases, step recording, ...) with a wall clock and runs the Mooncake trace once,
then prints each phase's calls, seconds, share of the run and time per call. Phases nest (a finish's release
runs inside the decode result processing), so shares do not add up to 100 %. The wrappers add ~1 us a call, so
absolute seconds are a little high; for the profile inside a phase use a sampling profiler (py-spy).

    python bench/sim_phases.py [TRACE] [--case 0|1]     # 0: Kimi-Linear-48B-A3B/H200, 1: Llama-3.1-70B tp8/H100
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim_mooncake import CASES, DEFAULT_TRACE  # noqa: E402  (the same two runs as the speed benchmark)

# (module, class or None, attribute, what the phase is)
PHASES = [
    ("poolsim.sim.schedule_batch", "ScheduleBatch", "prepare_for_extend", "prefill: rows, slots, prefix copy, tracks"),
    ("poolsim.sim.schedule_batch", "ScheduleBatch", "prepare_for_decode", "decode: one slot per request, seq lens"),
    ("poolsim.sim.scheduler", "Scheduler", "_process_decode_reqs", "decode results: append, finish (incl. releases)"),
    ("poolsim.sim.scheduler", None, "checkpoint_kv_cache", "tree insert of a chunk or a prefilled prompt"),
    ("poolsim.sim.schedule_policy", "SchedulePolicy", "calc_priority", "waiting-queue prefix refresh"),
    ("poolsim.sim.scheduler", None, "release_kv_cache", "finish: tree insert, frees"),
    ("poolsim.sim.engine", "Simulation", "_record", "one step row"),
    ("poolsim.sim.scheduler", None, "match_prefix_for_req", "admission prefix match"),
    ("poolsim.sim.scheduler", "Scheduler", "_reqs_finishing_inflight", "overlap: requests finishing in flight"),
    ("poolsim.sim.prefill_adder", "PrefillAdder", "__init__", "prefill budget from the running batch"),
    ("poolsim.sim.prefill_adder", "PrefillAdder", "add_one_req", "one admission decision"),
    ("poolsim.sim.schedule_batch", "ScheduleBatch", "check_decode_mem", "decode memory check"),
]


def instrument(stats: list) -> None:
    """Wrap each phase; ``stats[i]`` counts PHASES[i]'s calls and seconds."""
    import importlib

    for i, (module, cls, attr, _) in enumerate(PHASES):
        owner = importlib.import_module(module)
        if cls is not None:
            owner = getattr(owner, cls)
        inner = getattr(owner, attr)

        @functools.wraps(inner)
        def timed(*a, _inner=inner, _entry=stats[i], **kw):
            t = time.perf_counter()
            try:
                return _inner(*a, **kw)
            finally:
                _entry[0] += 1
                _entry[1] += time.perf_counter() - t

        setattr(owner, attr, timed)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", nargs="?", default=DEFAULT_TRACE)
    ap.add_argument("--case", type=int, choices=range(len(CASES)), default=0)
    opts = ap.parse_args(argv)
    stats = [[0, 0.0] for _ in PHASES]
    instrument(stats)
    from poolsim.app.run import simulate
    from poolsim.pools.hardware.gpu_catalog import get_gpu
    from poolsim.pools.model.config import ModelConfig
    from poolsim.pools.sizing.server_args import ServerArgs
    from poolsim.traces import load_trace

    name, gpu, tp = CASES[opts.case]
    trace = load_trace(opts.trace)
    t = time.perf_counter()
    r = simulate(trace, ModelConfig.load(name), get_gpu(gpu), ServerArgs(tp_size=tp))
    total = time.perf_counter() - t
    steps = r.steps
    prefill = int((steps["kind"] != "decode").sum())
    print(f"{name} on {gpu} tp {tp}: {len(steps):,} steps ({prefill:,} with prefill), {total:.1f} s wall")
    print(f"{'phase':<40} {'calls':>8} {'s':>7} {'share':>6} {'us/call':>8}  what")
    for (_, cls, attr, what), (n, s) in zip(PHASES, stats):
        print(f"{(cls + '.' if cls else '') + attr:<40} {n:>8,} {s:>7.2f} {s / total:>6.0%} {1e6 * s / max(n, 1):>8.1f}  {what}")


if __name__ == "__main__":
    main(sys.argv[1:])
