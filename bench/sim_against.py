"""Benchmark (not a test): this tree against an older commit, on the same host at the same moment.

CPU seconds of one run differ about 2x between the 2-vCPU hosts this project is measured on (bench/README.md),
so an absolute figure from one day cannot be compared with another day's. A ratio can: the older commit is
checked out in a temporary git worktree and both trees run the whole Mooncake trace (sim_mooncake.CASES),
alternated in pairs, each run its own process, its CPU seconds counted from before its imports.

    python bench/sim_against.py REV [TRACE] [--pairs N]       # e.g. REV = 6f6ddde, the code issue 15 measured

The older tree runs whatever it holds: a commit from before the compiled core runs pure Python; a later one runs
its sources too, since nothing is built in the worktree. Their tables need not be equal (the step-time defaults
may have been refit in between), so steps are printed, not hashes. The worktree is removed at the end.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as sim_mooncake.py and cli.py

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from sim_mooncake import CASES, DEFAULT_TRACE  # noqa: E402

# The simulate() call every commit since 2026-11-29 accepts; the child refuses to run code from another tree
# (an installed poolsim would otherwise shadow the tree's modules). A tree with a root __init__.py is the poolsim
# package itself (setup.py) and is loaded as ``poolsim`` from its own folder; an older tree's top-level packages
# (pools, sim, traces) are imported from its root.
CHILD = """
import importlib.util, json, sys, time
cpu0 = time.process_time()
root, path, case = sys.argv[1], sys.argv[2], int(sys.argv[3])
from pathlib import Path
if (Path(root) / "__init__.py").is_file():
    spec = importlib.util.spec_from_file_location("poolsim", Path(root) / "__init__.py",
                                                  submodule_search_locations=[root])
    package = importlib.util.module_from_spec(spec)
    sys.modules["poolsim"] = package
    spec.loader.exec_module(package)
    from poolsim import pools
    from poolsim.pools.hardware.gpu_catalog import get_gpu
    from poolsim.pools.model.config import ModelConfig
    from poolsim.pools.sizing.server_args import ServerArgs
    from poolsim.app.run import simulate
    from poolsim.traces import load_trace
    from poolsim.compiled import compiled_modules
    compiled = bool(compiled_modules())
else:
    sys.path.insert(0, root)
    import pools
    from pools.gpu_catalog import get_gpu
    from pools.model_config import ModelConfig
    from pools.server_args import ServerArgs
    from sim.run import simulate
    from traces import load_trace
    try:
        from pools._pure_python import compiled_modules
        compiled = bool(compiled_modules())
    except ImportError:  # a commit from before the compiled core
        compiled = False
if Path(pools.__file__).resolve().parents[1] != Path(root).resolve():
    sys.exit(f"imported pools from {pools.__file__}, not from {root}")
name, gpu, tp = json.loads(sys.argv[4])[case]
s = simulate(load_trace(path), ModelConfig.load(name), get_gpu(gpu), ServerArgs(tp_size=tp)).summary
print(json.dumps({"steps": int(s["steps"]), "cpu_s": time.process_time() - cpu0, "compiled": compiled}))
"""


def run(root: Path, path: Path, case: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(root), str(path), str(case), json.dumps(CASES)],
                         capture_output=True, text=True, cwd=root)
    if out.returncode:
        raise SystemExit(f"error: the run in {root} failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    pairs = 2
    if "--pairs" in argv:
        i = argv.index("--pairs")
        value = argv[i + 1] if i + 1 < len(argv) else ""
        if not value.isdigit() or int(value) < 1:
            raise SystemExit(f"error: --pairs {value!r}: expected a whole number >= 1")
        pairs = int(value)
        del argv[i:i + 2]
    if not argv:
        raise SystemExit(__doc__)
    rev = argv[0]
    # absolute: each run's working directory is its own tree
    path = Path(argv[1] if len(argv) > 1 else DEFAULT_TRACE).resolve()
    if not path.is_file():
        raise SystemExit(f"error: {path}: no such trace file")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode:
        raise SystemExit(f"error: {ROOT} is not a git checkout: {head.stderr.strip()}")
    with tempfile.TemporaryDirectory(prefix="poolsim-bench-") as tmp:
        tree = Path(tmp) / "older"
        add = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev],
                             capture_output=True, text=True)
        if add.returncode:
            raise SystemExit(f"error: cannot check out {rev}: {add.stderr.strip()}")
        try:
            print(f"trace {path}; {rev} against this tree ({head.stdout.strip()}"
                  f"{', with uncommitted changes' if _dirty() else ''}), {pairs} alternated pairs, CPU s")
            for case, (name, gpu, tp) in enumerate(CASES):
                old, new = [], []
                for _ in range(pairs):
                    old.append(run(tree, path, case))
                    new.append(run(ROOT, path, case))
                ratio = statistics.median(o["cpu_s"] for o in old) / statistics.median(n["cpu_s"] for n in new)
                print(f"{name} / {gpu} tp{tp}: {rev} {_runs(old)}; this tree {_runs(new)}; {ratio:.2f}x (medians)",
                      flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           capture_output=True)


def _runs(runs: list[dict]) -> str:
    seconds = ", ".join(f"{r['cpu_s']:.1f}" for r in runs)
    return f"{seconds} ({runs[0]['steps']:,} steps, {'compiled' if runs[0]['compiled'] else 'Python'})"


def _dirty() -> bool:
    return bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main(sys.argv[1:])
