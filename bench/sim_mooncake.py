"""Benchmark (not a test): the whole Mooncake conversation trace through the simulator, radix cache on,
for Kimi-Linear-48B-A3B (H200, tp 1) and Llama-3.1-70B (H100, tp 8). Prints wall seconds, simulated
requests/s, scheduler steps/s and peak RSS.

    python bench/sim_mooncake.py [TRACE]
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pools.gpu_catalog import get_gpu  # noqa: E402
from pools.model_config import ModelConfig  # noqa: E402
from pools.server_args import ServerArgs  # noqa: E402
from sim.run import simulate  # noqa: E402
from traces import load_trace  # noqa: E402

CASES = [("kimi-linear-48b-a3b", "H200", 1), ("llama-3.1-70b", "H100", 8)]


def main(path: str) -> None:
    trace = load_trace(path)
    print(f"trace {path}: {len(trace):,} requests")
    print(f"{'model':<22} {'gpu':<5} {'tp':>2} {'wall s':>7} {'sim req/s':>10} {'steps':>8} {'steps/s':>8} "
          f"{'sim s':>8} {'retracted':>9} {'peak RSS GiB':>12}")
    for name, gpu, tp in CASES:
        t0 = time.perf_counter()
        r = simulate(trace, ModelConfig.load(name), get_gpu(gpu), ServerArgs(tp_size=tp))
        wall = time.perf_counter() - t0
        s = r.summary
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"{name:<22} {gpu:<5} {tp:>2} {wall:>7.1f} {s['requests'] / wall:>10,.0f} {s['steps']:>8,} "
              f"{s['steps'] / wall:>8,.0f} {s['duration_s']:>8,.0f} {s['retractions']:>9,} {rss:>12.2f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT.parent / "shared/traces/mooncake_conversation_trace.jsonl"))
