"""Peak memory (max RSS) and CPU time of `poolsim trace generate` and `trace inspect` on a large workload.

Each command runs in its own process; its max RSS comes from getrusage(RUSAGE_CHILDREN), CPU time likewise (the
machine's cores are shared, so wall time would not mean much). Target (issue #11): 1M requests under 1 GiB.

    python bench/trace_memory.py [--requests 1000000] [--dir /tmp]

Measured (2 shared cores, 1M requests = 285,714 chat sessions, a 277 MiB file): generate 221 MiB max RSS and
19.5 s CPU (933 MiB when it held every request); inspect 789 MiB and 52.3 s CPU.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TURNS_MEAN = 3.5  # the chat preset's turns: uniform 1..6


# a wrapper process whose only child is the command: its RUSAGE_CHILDREN is that command's alone
WRAPPER = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
           "u = resource.getrusage(resource.RUSAGE_CHILDREN); print(u.ru_maxrss, u.ru_utime + u.ru_stime)")


def measure(args: list[str]) -> tuple[float, float]:
    """(peak RSS in MiB, CPU seconds) of one CLI run in a fresh process."""
    out = subprocess.run([sys.executable, "-c", WRAPPER, sys.executable, str(REPO / "cli.py"), *args], check=True,
                         capture_output=True, text=True).stdout.split()
    return int(out[0]) / 1024, float(out[1])  # ru_maxrss is KiB on Linux


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=1_000_000)
    p.add_argument("--dir", default=tempfile.gettempdir())
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="poolsim-bench-", dir=a.dir))  # a folder of our own: only it is removed
    path = work / "trace.jsonl"
    sessions = int(a.requests / TURNS_MEAN)
    try:
        # a high session rate keeps every arrival well inside the one-year bound on trace times
        rss, cpu = measure(["trace", "generate", str(path), "--sessions", str(sessions), "--rate", "50", "--json"])
        size = path.stat().st_size
        print(f"trace generate  {sessions:,} sessions -> {size / 2**20:,.0f} MiB file: "
              f"max RSS {rss:,.0f} MiB, CPU {cpu:,.1f} s")
        rss2, cpu2 = measure(["trace", "inspect", str(path), "--json"])
        print(f"trace inspect   the same file: max RSS {rss2:,.0f} MiB, CPU {cpu2:,.1f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
