"""Waiting-queue order (SGLang's ``SchedulePolicy``): ``fcfs`` (the default) and ``lpm``.

fcfs keeps arrival order and, every 32nd scheduling pass, touches the first 128 waiting prompts in the
tree so LRU eviction spares them (``_touch_waiting_prefixes``). lpm matches every waiting request and
sorts by matched length, deferring requests whose prefix another waiting request already brings
(in-batch prefix caching); with more than 128 waiting it falls back to fcfs.
"""

from __future__ import annotations

import numpy as np

from poolsim.pools.mem_cache.allocation import match_prefix_for_req
from poolsim.pools.mem_cache.base_prefix_cache import BasePrefixCache
from poolsim.pools.mem_cache.radix_cache import RadixCache, RadixKey

WAITING_QUEUE_PREFIX_MATCH_MAX = 128
WAITING_PREFIX_REFRESH_INTERVAL = 32
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32


class _NullAllocator:
    """Slots for the simulated waiting-queue tree, which stores no KV."""

    page_size = 1

    def free_segment(self, idx, start_pos: int = 0) -> None:
        pass

    def available_size(self) -> int:
        return 0


class SchedulePolicy:
    def __init__(self, policy: str, tree_cache: BasePrefixCache):
        if policy not in ("fcfs", "lpm"):
            raise ValueError(f"--schedule-policy: {policy!r} is not simulated (fcfs, lpm)")
        # SGLang turns cache-aware policies into fcfs when the radix cache is disabled.
        self.policy = "fcfs" if tree_cache.disable else policy
        self.tree_cache = tree_cache
        self._refresh_calls = 0
        self._refresh_hints: dict = {}  # waiting Req -> (seqlen, its touch_prefix hint)
        self._waiting_tree = RadixCache(None, _NullAllocator(), page_size=1)

    def calc_priority(self, waiting_queue: list) -> None:
        active = self.policy
        if active == "lpm" and len(waiting_queue) > WAITING_QUEUE_PREFIX_MATCH_MAX:
            active = "fcfs"
        if active == "lpm":
            deprioritized = self._compute_prefix_matches(waiting_queue)
            waiting_queue.sort(key=lambda r: float("inf") if r.rid in deprioritized else -r.num_matched_prefix_tokens)
            return
        self._touch_waiting_prefixes(waiting_queue)

    def _touch_waiting_prefixes(self, waiting_queue: list) -> None:
        if not waiting_queue or self.tree_cache.disable:
            return
        refresh = self._refresh_calls % WAITING_PREFIX_REFRESH_INTERVAL == 0
        self._refresh_calls += 1
        if refresh:
            # A request's first seqlen tokens never change while it waits, so the hint from its last
            # refresh (RadixCache.touch_prefix) stays valid for as long as its seqlen does.
            hints = {}
            for r in waiting_queue[:WAITING_QUEUE_PREFIX_MATCH_MAX][::-1]:  # not reversed(): mypyc fails on it
                seqlen, hint = self._refresh_hints.get(r, (None, None))
                if seqlen != r.seqlen:
                    hint = None
                hints[r] = (r.seqlen, self.tree_cache.touch_prefix(
                    lambda r=r: RadixKey(r.token_ids(r.seqlen), r.extra_key), hint))
            self._refresh_hints = hints

    def _touch_waiting_prefixes_reference(self, waiting_queue: list) -> None:
        """``_touch_waiting_prefixes`` as SGLang does it: on a refresh pass, a whole ``match_prefix`` of each of
        the first 128 waiting prompts, last first (tests/sim/test_schedule_policy.py checks that both agree)."""
        if not waiting_queue or self.tree_cache.disable:
            return
        refresh = self._refresh_calls % WAITING_PREFIX_REFRESH_INTERVAL == 0
        self._refresh_calls += 1
        if refresh:
            for r in waiting_queue[:WAITING_QUEUE_PREFIX_MATCH_MAX][::-1]:
                self.tree_cache.match_prefix(RadixKey(r.token_ids(r.seqlen), r.extra_key))

    def _compute_prefix_matches(self, waiting_queue: list) -> set:
        deprioritized = set()
        self._waiting_tree.reset()
        for r in waiting_queue:
            tokens = r.token_ids(r.seqlen)
            match_prefix_for_req(r, self.tree_cache, max_prefix_len=r.seqlen, cow_mamba=False)
            r.num_matched_prefix_tokens = min(r.prefix_len, max(r.seqlen - 1, 0))
            if r.prefix_len <= IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD:
                key = RadixKey(tokens, r.extra_key)
                if self._waiting_tree.match_prefix(key).prefix_len >= IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD:
                    deprioritized.add(r.rid)
                else:
                    self._waiting_tree.insert(key, np.zeros(len(tokens), dtype=np.int64), prev_prefix_len=len(tokens))
        return deprioritized
