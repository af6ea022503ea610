"""Benchmark (not a test): SGLang bench_serving's common sweep, simulated: random-ids 1000 prompts of 1024 in,
1024 out (ratio 0, seed 42), concurrency 1, 16, 64 back to back with --flush-cache, Llama-3.1-8B on one H100.
Prints CPU seconds per run of the simulator and bench_serving's headline figures.

    python bench/bench_serving_sim.py
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from poolsim.app.bench_serving import BenchConfig, run_bench  # noqa: E402
from poolsim.pools.hardware.gpu_catalog import get_gpu  # noqa: E402
from poolsim.pools.model.config import ModelConfig  # noqa: E402
from poolsim.pools.sizing.server_args import ServerArgs  # noqa: E402

CONCURRENCY = (1, 16, 64)


def main() -> None:
    configs = [BenchConfig("random-ids", 1000, 1024, 1024, 0.0, max_concurrency=c, flush_cache=True)
               for c in CONCURRENCY]
    t0 = time.process_time()
    result, metrics = run_bench(configs, ModelConfig.load("llama-3.1-8b"), get_gpu("H100"), ServerArgs())
    cpu = time.process_time() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"simulated {len(result.requests):,} requests, {len(result.steps):,} steps in {cpu:.1f} CPU s "
          f"({len(result.steps) / cpu:,.0f} steps/s), peak RSS {rss:.2f} GiB")
    print(f"{'conc':>5} {'dur s':>8} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} "
          f"{'ITL p99':>8} {'E2E p50':>9}")
    for c, m in zip(CONCURRENCY, metrics):
        print(f"{c:>5} {m['duration']:>8.1f} {m['output_throughput']:>10,.0f} {m['median_ttft_ms']:>9.1f} "
              f"{m['p99_ttft_ms']:>9.1f} {m['median_tpot_ms']:>9.2f} {m['p99_itl_ms']:>8.2f} "
              f"{m['median_e2e_latency_ms']:>9.0f}")


if __name__ == "__main__":
    main()
