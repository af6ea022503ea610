"""Benchmark (not a test): every prompt of the Mooncake conversation trace matched and inserted through
``RadixCache`` with a pool large enough never to evict. Prints wall time, matches per second and the
prefix hit rate.

    python bench/radix_mooncake.py [TRACE]   (default ../shared/traces/mooncake_conversation_trace.jsonl)
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from poolsim.pools import RadixCache, RadixKey, ReqToTokenPool, TokenToKVPoolAllocator  # noqa: E402
from poolsim.traces import load_trace  # noqa: E402


def main(path: str) -> None:
    trace = load_trace(path)
    total = sum(r.input_len for r in trace)
    alloc = TokenToKVPoolAllocator(total)  # unbounded: every prompt token fits
    tree = RadixCache(ReqToTokenPool(1, 1), alloc)
    matched = n = 0
    match_s = insert_s = 0.0
    t0 = time.perf_counter()
    for req in trace:
        tokens = req.prompt_tokens()
        t = time.perf_counter()
        hit = tree.match_prefix(RadixKey(tokens, req.namespace))
        match_s += time.perf_counter() - t
        fresh = alloc.alloc(len(tokens) - hit.prefix_len)
        t = time.perf_counter()
        tree.insert(RadixKey(tokens, req.namespace), np.concatenate([hit.device_indices, fresh]),
                    prev_prefix_len=hit.prefix_len)
        insert_s += time.perf_counter() - t
        matched += hit.prefix_len
        n += 1
    wall = time.perf_counter() - t0
    rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"trace            {path}")
    print(f"requests         {n:,}   prompt tokens {total:,}")
    print(f"wall             {wall:.2f} s  (match {match_s:.2f} s, insert {insert_s:.2f} s, rest: token "
          f"expansion and allocation)")
    print(f"matches/s        {n / match_s:,.0f}   inserts/s {n / insert_s:,.0f}   requests/s {n / wall:,.0f}")
    print(f"prefix hit rate  {matched / total:.2%}  ({matched:,} of {total:,} prompt tokens; page size 1, "
          f"prompts only, no len-1 cap)")
    print(f"tree             {tree.total_size():,} tokens cached, peak RSS {rss_gib:.2f} GiB")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT.parent / "shared/traces/mooncake_conversation_trace.jsonl"))
