"""A batch of requests and the memory work done for it (SGLang's ``ScheduleBatch``).

Allocation happens when a batch is prepared (``prepare_for_extend``/``prepare_for_decode``);
``check_decode_mem`` evicts the shortfall before answering; ``retract_decode`` frees requests
until the next decode step fits (docs/sglang.md 6.4).
"""

from __future__ import annotations

from typing import Any

from poolsim.pools.mem_cache.allocation import (
    alloc_for_decode_kvs,
    alloc_for_extend,
    alloc_for_spec_decode,
    check_decode_capacity,
    evict_from_tree_cache,
    release_kv_cache,
    spec_new_tokens_required_next_decode,
)
from poolsim.pools.mem_cache.base_prefix_cache import BasePrefixCache
from poolsim.pools.mem_cache.swa_radix_cache import SWA_EVICTION_INTERVAL
from poolsim.sim.req import Req

RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS: headroom kept per remaining request


class ScheduleBatch:
    __slots__ = ("reqs", "forward_mode", "batch_is_full", "decoding_reqs", "extend_lens", "prefix_lens",
                 "cached_lens", "decode_seq_lens_sum", "num_decode_reqs", "chunked_req", "tree_cache",
                 "req_to_token_pool", "mamba_tracks", "spec_reserve")

    def __init__(self, reqs: list[Req], tree_cache, req_to_token_pool, forward_mode: str = "decode",
                 spec_reserve: int = 0):
        self.reqs: list[Req] = list(reqs)
        self.forward_mode = forward_mode  # extend | decode | mixed
        self.batch_is_full = False
        self.decoding_reqs: list[Req] | None = None  # decode rows riding a mixed prefill batch
        self.extend_lens: list[int] = []
        self.prefix_lens: list[int] = []
        self.cached_lens: list[int] = []  # prefix hits at admission (a continuing chunk's prefix is its own)
        # what the step-time model reads of the decode rows (SGLang's seq_lens_sum): their count and the sum of
        # their sequence lengths after this step's slot; the lengths themselves are the rows' kv_committed_len
        self.decode_seq_lens_sum = 0
        self.num_decode_reqs = 0
        self.chunked_req: Any = None
        # Untyped: a batch built only for its shape (the step-time model's tests) holds no tree or pool; the
        # methods that call the tree read it into a local typed BasePrefixCache so the compiled calls are direct.
        self.tree_cache = tree_cache
        self.req_to_token_pool = req_to_token_pool
        # extra_buffer: {req: (position, seqlen)} decode checkpoints awaiting the result
        self.mamba_tracks: dict | None = None
        # speculative decoding: the slots each request keeps reserved past its committed KV (2 x alloc_len per
        # decode step, sim/speculative.py); 0: one slot per decode step
        self.spec_reserve = spec_reserve

    def copy(self) -> "ScheduleBatch":
        """What the result processor sees: the membership and shape at launch time."""
        b = ScheduleBatch(self.reqs, self.tree_cache, self.req_to_token_pool, self.forward_mode, self.spec_reserve)
        b.decoding_reqs = self.decoding_reqs
        b.extend_lens, b.prefix_lens = self.extend_lens, self.prefix_lens
        b.decode_seq_lens_sum, b.num_decode_reqs = self.decode_seq_lens_sum, self.num_decode_reqs
        b.cached_lens = self.cached_lens
        b.chunked_req = self.chunked_req
        b.mamba_tracks = self.mamba_tracks
        return b

    def is_empty(self) -> bool:
        return not self.reqs

    def batch_size(self) -> int:
        return len(self.reqs)

    def is_extend(self) -> bool:
        return self.forward_mode in ("extend", "mixed")

    # ---------------------------------------------------------------- membership
    def filter_batch(self, reqs_to_exclude=(), keep_indices=None) -> None:
        if keep_indices is None:
            if reqs_to_exclude:
                exclude = set(reqs_to_exclude)  # requests hash and compare by identity
                self.reqs = [r for r in self.reqs if r.finished_reason is None and r not in exclude]
            else:
                self.reqs = [r for r in self.reqs if r.finished_reason is None]
        else:
            self.reqs = [self.reqs[i] for i in keep_indices]

    def merge_batch(self, other: "ScheduleBatch") -> None:
        self.reqs.extend(other.reqs)

    # ---------------------------------------------------------------- extend
    def prepare_for_extend(self) -> None:
        """Allocate rows, state slots and KV for ``[prefix_len, extend_end)`` of every request."""
        self.forward_mode = "extend"
        self.prefix_lens = [r.prefix_len for r in self.reqs]
        self.extend_lens = [r.extend_end - r.prefix_len for r in self.reqs]
        tree: BasePrefixCache = self.tree_cache  # typed: the compiled build calls its methods directly
        alloc_for_extend(self.reqs, tree, self.req_to_token_pool)
        if tree.supports_mamba():
            for r, pre in zip(self.reqs, self.prefix_lens):
                tree.track_after_extend(r, pre, r.extend_end)

    def mix_with_running(self, running: "ScheduleBatch") -> None:
        self.forward_mode = "mixed"
        self.decoding_reqs = list(running.reqs)
        self.decode_seq_lens_sum, self.num_decode_reqs = running.decode_seq_lens_sum, running.num_decode_reqs
        self.mamba_tracks = running.mamba_tracks
        self.reqs.extend(running.reqs)

    # ---------------------------------------------------------------- decode
    def new_tokens_required_next_decode(self, reqs=None) -> int:
        reqs = self.reqs if reqs is None else reqs
        tree: BasePrefixCache = self.tree_cache
        ps = tree.token_to_kv_pool_allocator.page_size
        if self.spec_reserve:  # schedule_batch.py:3413-3419
            return spec_new_tokens_required_next_decode([r.kv for r in reqs], self.spec_reserve, ps)
        if ps == 1:
            return len(reqs)
        return ps * sum(1 for r in reqs if r.kv.kv_committed_len % ps == 0)

    def check_decode_mem(self, reqs=None) -> bool:
        return check_decode_capacity(self.tree_cache, self.new_tokens_required_next_decode(reqs))

    def prepare_for_decode(self) -> None:
        """One new KV slot per request (SGLang allocates it before the forward); speculative decoding: every
        request's reservation (``prepare_for_spec_decode``)."""
        if self.spec_reserve:
            self.prepare_for_spec_decode()
            return
        self.forward_mode = "decode"
        tree: BasePrefixCache = self.tree_cache
        if tree.supports_swa():
            self.evict_swa()
        kvs = [r.kv for r in self.reqs]  # typed requests: native reads when compiled
        alloc_for_decode_kvs(kvs, tree, self.req_to_token_pool)
        total = 0  # kv_committed_len + 1 before the allocation, i.e. after it; a native sum, no list of lengths
        for r, kv in zip(self.reqs, kvs):
            r.decode_batch_idx += 1
            total += kv.kv_committed_len
        self.decode_seq_lens_sum, self.num_decode_reqs = total, len(kvs)
        if tree.supports_mamba():
            self.mamba_tracks = tree.decode_tracks(self.reqs, kvs) or None

    def prepare_for_spec_decode(self) -> None:
        """``eagle_prepare_for_decode`` (speculative/eagle_utils.py:857-921): every row grows to
        ``ceil_page(kv_committed_len + 2 x alloc_len)``, in batch order; the verify result commits what it accepts.
        The step-time model reads the committed lengths: the KV the draft and verify passes attend to."""
        self.forward_mode = "decode"
        tree: BasePrefixCache = self.tree_cache
        kvs = [r.kv for r in self.reqs]
        alloc_for_spec_decode(kvs, tree, self.req_to_token_pool, self.spec_reserve)
        total = 0
        for r, kv in zip(self.reqs, kvs):
            r.decode_batch_idx += 1
            total += kv.kv_committed_len
        self.decode_seq_lens_sum, self.num_decode_reqs = total, len(kvs)

    def evict_swa(self) -> None:
        """``maybe_evict_swa`` before a decode allocation: a request past its first decode batch (under
        overlap the previous extend may still run) frees its own out-of-window SWA KV once at least
        ``SWA_EVICTION_INTERVAL`` tokens have left the window."""
        tree = self.tree_cache
        window = tree.sliding_window_size
        allocator = tree.token_to_kv_pool_allocator
        allocator.free_group_begin()
        try:
            for r in self.reqs:
                if r.decode_batch_idx >= 1 and r.kv.holds_kv and \
                        r.seqlen - 1 - window >= r.kv.swa_evicted_seqlen + SWA_EVICTION_INTERVAL:
                    tree.evict_sliding_window(r, r.seqlen - 1)
        finally:
            allocator.free_group_end()

    def retract_decode(self):
        """Release requests (fewest outputs first, ties: longest prompt) until the next decode fits.

        Always retracts at least one; never the last one; aborts the last one if even it cannot fit.
        Returns (retracted, new_token_ratio, aborted)."""
        order = sorted(range(len(self.reqs)), key=lambda i: (self.reqs[i].num_output,
                                                              -self.reqs[i].origin_input_len), reverse=True)
        retracted, aborted = [], []
        first = True
        while first or not self.check_decode_mem([self.reqs[i] for i in order]):
            if len(order) == 1:
                break
            first = False
            idx = order.pop()
            self._release_req(self.reqs[idx], len(order))
            retracted.append(self.reqs[idx])
        if len(order) <= 1 and not self.check_decode_mem([self.reqs[i] for i in order]):
            idx = order.pop()
            self._release_req(self.reqs[idx], 0, retract=False)
            aborted.append(self.reqs[idx])  # the scheduler marks it FINISH_ABORT
        self.filter_batch(keep_indices=order)
        decoded = sum(r.num_output for r in self.reqs)
        budget = sum(r.max_new_tokens for r in self.reqs)
        new_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(self.reqs)) / (budget + 1))
        return retracted, new_ratio, aborted

    def _release_req(self, req, remaining: int, retract: bool = True) -> None:
        release_kv_cache(req, self.tree_cache, checkpoint=False)  # nothing inserted: the space is needed now
        evict_from_tree_cache(self.tree_cache, remaining * RETRACT_DECODE_STEPS)
        if retract:
            req.reset_for_retract()
