"""Instructions, not seconds: the head of the Mooncake trace under valgrind's callgrind, compiled core and pure Python.

CPU seconds on a shared VM vary by 10-20 % between identical runs; an instruction count does not depend on what else
the machine does (repeat runs differ by ~0.5 % of the process total here, from address-dependent orders of
identity-keyed sets and dicts), so it shows a small speedup that wall clocks cannot. It is a
proxy (cache misses and branch stalls do not count), so the seconds in sim_mooncake.py stay the figure of record.

    python bench/sim_instructions.py [TRACE] [--requests N]     # the first N lines (1500); ~10 min in all

Prints, per case of sim_mooncake.CASES, the instructions of ``simulate()`` (a process that simulates, less one that
stops after the imports and the trace load) with the compiled modules and with POOLSIM_PURE_PYTHON=1, and their
ratio. Needs valgrind (Debian's package) and a compiled build.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from sim_mooncake import CASES, DEFAULT_TRACE  # noqa: E402

CHILD = """
import json, sys
from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.server_args import ServerArgs
from poolsim.app.run import simulate
from poolsim.traces import load_trace
import poolsim.compiled as pure
path, case, run = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "run"
name, gpu, tp = json.loads(sys.argv[4])[case]
trace, model, gpu = load_trace(path), ModelConfig.load(name), get_gpu(gpu)
steps = int(simulate(trace, model, gpu, ServerArgs(tp_size=tp)).summary["steps"]) if run else 0
print(json.dumps({"steps": steps, "compiled": len(pure.compiled_modules())}))
"""


def count(path: str, case: int, pure: bool, run: bool) -> tuple[int, dict]:
    env = {**os.environ, "POOLSIM_PURE_PYTHON": "1" if pure else "0"}
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out",
                              sys.executable, "-c", CHILD, path, str(case), "run" if run else "load",
                              json.dumps(CASES)], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    collected = re.search(r"Collected : (\d+)", out.stderr)
    return int(collected.group(1)), json.loads(out.stdout.strip().splitlines()[-1])


def simulation_instructions(path: str, case: int, pure: bool) -> tuple[int, dict]:
    """The whole process less the same process stopped before simulate (imports, trace load, model)."""
    total, info = count(path, case, pure, run=True)
    base, _ = count(path, case, pure, run=False)
    return total - base, info


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = DEFAULT_TRACE
    parser.add_argument("trace", nargs="?", default=default)
    parser.add_argument("--requests", type=int, default=1500, help="the first N requests of the trace")
    args = parser.parse_args(argv)
    with open(args.trace) as f, tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as head:
        head.writelines(line for _, line in zip(range(args.requests), f))  # Mooncake: one request a line
    try:
        report(head.name, args)
    finally:
        os.unlink(head.name)


def report(path: str, args) -> None:
    print(f"trace {args.trace}, first {args.requests} lines; instructions (callgrind) of simulate() alone")
    print(f"{'model':<20} {'gpu':<4} {'tp':>2} {'steps':>6} {'compiled':>15} {'pure Python':>15} {'ratio':>6}")
    for case, (name, gpu, tp) in enumerate(CASES):
        compiled, info = simulation_instructions(path, case, pure=False)
        if not info["compiled"]:
            sys.exit("no compiled build here (pip install -e . compiles it): nothing to compare")
        pure, info_pure = simulation_instructions(path, case, pure=True)
        assert info_pure["compiled"] == 0 and info_pure["steps"] == info["steps"]
        print(f"{name:<20} {gpu:<4} {tp:>2} {info['steps']:>6,} {compiled:>15,} {pure:>15,} {pure / compiled:>6.2f}",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
