"""Prefill admission (SGLang's ``PrefillAdder`` with the fixed-pool ``PrefillBudget``; docs/sglang.md 6.2).

    avail      = available + evictable            (mamba trees: FULL evictable only)
    rem_total  = avail - total_offset             total_offset: running requests' min(remaining, 4096) x ratio
                                                  + every admitted ceil_page(extend) + page + max_new
    cur_rem    = avail - current_offset           current_offset: admitted ceil_page(extend) + page
    admit iff  extend + max_new + page < rem_total   (strictly), under a temporary lock on the prefix
Both remainders are live: locking a candidate's prefix shrinks ``evictable`` at once.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any

from mypy_extensions import mypyc_attr

from poolsim.pools.mem_cache.base_prefix_cache import BasePrefixCache

if TYPE_CHECKING:
    from poolsim.sim.schedule_batch import ScheduleBatch

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
IGNORE_EOS_RESERVE_TOKENS = 1  # schedule_policy.py: kept free per request by add_one_req_ignore_eos


class AddReqResult(Enum):
    CONTINUE = 0
    NO_TOKEN = 1
    OTHER = 2


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed in swa_* (not compiled)
class PrefillAdder:
    def __init__(self, page_size: int, tree_cache: BasePrefixCache, running_batch: ScheduleBatch,
                 new_token_ratio: float, rem_input_tokens: int, rem_chunk_tokens: int | None,
                 num_mixed_decode_tokens: int = 0):
        self.page_size = page_size
        self.tree_cache = tree_cache
        self.allocator = tree_cache.token_to_kv_pool_allocator
        self.new_token_ratio = new_token_ratio
        self.rem_input_tokens = rem_input_tokens - num_mixed_decode_tokens
        self.rem_chunk_tokens = None if rem_chunk_tokens is None else rem_chunk_tokens - num_mixed_decode_tokens
        self.total_offset: float = float(num_mixed_decode_tokens)  # float once running requests' reservations add
        self.current_offset = num_mixed_decode_tokens
        self.can_run_list: list = []
        self.new_chunked_req: Any = None
        self.log_hit_tokens = 0
        self.log_input_tokens = 0
        self._mamba = tree_cache.supports_mamba()
        self.running_batch = running_batch
        self.req_states: list | None = None  # add_one_req_ignore_eos: (tokens_left, tokens_occupied), sorted
        total: float = self.total_offset  # added one request at a time, in order: float sums depend on the order
        for r in running_batch.reqs:
            left = r.max_new_tokens - r.num_output
            total += (left if left < CLIP_MAX_NEW_TOKENS else CLIP_MAX_NEW_TOKENS) * \
                (1.0 if r.ignore_eos else new_token_ratio)
        self.total_offset = total

    # ---------------------------------------------------------------- budget
    def _avail(self) -> int:
        evictable = self.tree_cache.full_evictable_size() if self._mamba else self.tree_cache.evictable_size()
        return self.allocator.available_size() + evictable

    @property
    def rem_total_tokens(self) -> float:
        return self._avail() - self.total_offset

    @property
    def cur_rem_tokens(self) -> float:
        return self._avail() - self.current_offset

    def ceil_paged_tokens(self, tokens: int) -> int:
        return -(-tokens // self.page_size) * self.page_size

    def budget_state(self) -> AddReqResult:
        if self.rem_total_tokens <= 0 or self.cur_rem_tokens <= 0:
            return AddReqResult.NO_TOKEN
        if self.rem_input_tokens <= 0:
            return AddReqResult.OTHER
        if self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0:
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def _update_prefill_budget(self, prefix_len: int, extend_len: int, max_new_tokens: int) -> None:
        paged = self.ceil_paged_tokens(extend_len)
        self.total_offset += paged + self.page_size + max_new_tokens
        self.current_offset += paged + self.page_size
        self.rem_input_tokens -= paged
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= paged
        self.log_hit_tokens += prefix_len
        self.log_input_tokens += extend_len

    # ---------------------------------------------------------------- candidates
    def add_chunked_req(self, req):
        """Re-admit the one chunked request first; it must make progress. Returns it while still truncated."""
        rem = self._available_chunk_tokens()
        if rem is None:
            return req  # not this step (an SWA pool without room for another chunk)
        cand = req.seqlen - req.prefix_len
        truncated = cand > rem
        new_len = min(cand, rem)
        req.extend_end = req.prefix_len + new_len
        self.can_run_list.append(req)
        self._update_prefill_budget(0, new_len, 0 if truncated else min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS))
        return req if truncated else None

    def _available_chunk_tokens(self) -> int | None:
        """The continuing chunk's size cap; a single pool must let it progress to release its KV."""
        rem = min(self.rem_chunk_tokens, int(self.rem_total_tokens))  # type: ignore[type-var]  # set when called
        return rem if rem > 0 else self.rem_chunk_tokens  # type: ignore[operator]

    def _check_prefill_budget(self, req, extend_len: int, total_tokens: int) -> tuple[bool, int | None]:
        """(admit, chunk size limit) (``PrefillBudget.check_prefill``)."""
        return total_tokens < self.rem_total_tokens, self.rem_chunk_tokens

    def add_one_req(self, req, has_chunked_req: bool) -> AddReqResult:
        if req.ignore_eos and self.tree_cache.disable:
            return self.add_one_req_ignore_eos(req)
        max_new = min(max(req.max_new_tokens - req.num_output, 0), CLIP_MAX_NEW_TOKENS)
        cand = req.seqlen - req.prefix_len
        total_tokens = cand + max_new + self.page_size
        lock = self.tree_cache.lock(req.last_node)  # the candidate's own prefix is not evictable budget
        try:
            admission = self._select_prefill_admission(req, total_tokens)
            if isinstance(admission, AddReqResult):
                return admission
            extend_len, max_new_tokens, is_chunked = admission
            req.extend_end = req.prefix_len + extend_len
            req.lock = self.tree_cache.lock(req.last_node)
            self.can_run_list.append(req)
            if is_chunked:
                self.new_chunked_req = req
            self._update_prefill_budget(req.prefix_len, extend_len, max_new_tokens)
        finally:
            self.tree_cache.unlock(lock)
        return self.budget_state()

    def _select_prefill_admission(self, req, total_tokens: int):
        prefix_len = req.prefix_len
        extend_len = req.seqlen - prefix_len
        input_tokens = self.ceil_paged_tokens(extend_len)
        can_admit, chunk_limit = self._check_prefill_budget(req, extend_len, total_tokens)
        if not can_admit:
            return AddReqResult.NO_TOKEN
        if self.rem_chunk_tokens is None and self.can_run_list and input_tokens >= self.rem_input_tokens:
            return AddReqResult.OTHER  # no chunking: only the first request may exceed the input cap
        max_new_tokens = min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS)
        is_chunked = False
        if chunk_limit is not None and input_tokens > chunk_limit:
            extend_len = chunk_limit // self.page_size * self.page_size
            end = (prefix_len + extend_len) // self.page_size * self.page_size
            extend_len = end - prefix_len
            if extend_len <= 0:
                return AddReqResult.OTHER
            is_chunked, max_new_tokens = True, 0
        return extend_len, max_new_tokens, is_chunked

    def add_one_req_ignore_eos(self, req) -> AddReqResult:
        """Radix cache disabled and ``ignore_eos`` (every ``bench_serving --disable-radix-cache`` request): the
        output lengths are known, so SGLang replays the running requests finishing shortest-remaining-first
        (each frees what it occupies) and admits if the pool never runs dry, keeping 1 token per request."""
        cand = req.seqlen - req.prefix_len
        paged_input = self.ceil_paged_tokens(cand) + self.page_size
        if not paged_input <= min(self.cur_rem_tokens, self.rem_total_tokens):
            return AddReqResult.NO_TOKEN
        if self.req_states is None:
            self.req_states = []
            for r in [req, *self.running_batch.reqs, *self.can_run_list]:
                self._add_req_state(r)
            self.req_states.sort(key=lambda x: x[0])
        else:
            self._add_req_state(req, insert_sort=True)
        cur_rem = self.cur_rem_tokens - paged_input
        freed = 0
        for i, (tokens_left, tokens_occupied) in enumerate(self.req_states):
            bs = len(self.req_states) - i
            if cur_rem + freed - tokens_left * bs <= IGNORE_EOS_RESERVE_TOKENS * bs:
                return AddReqResult.NO_TOKEN
            freed += tokens_occupied
        if self.rem_chunk_tokens is None or cand <= self.rem_chunk_tokens:
            req.extend_end = req.prefix_len + cand
            self.can_run_list.append(req)
            self._update_prefill_budget(0, cand, min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS))
        else:
            if self.rem_chunk_tokens <= 0:
                return AddReqResult.OTHER
            # the chunk is the whole remaining chunk budget, not page-aligned (this path has no alignment)
            req.extend_end = req.prefix_len + self.rem_chunk_tokens
            self.can_run_list.append(req)
            self.new_chunked_req = req
            self._update_prefill_budget(0, self.rem_chunk_tokens, 0)
        return self.budget_state()

    def _add_req_state(self, r, insert_sort: bool = False) -> None:
        ratio = 1.0 if r.ignore_eos else self.new_token_ratio
        tokens_left = r.max_new_tokens * ratio - r.num_output
        if tokens_left <= 0:
            return
        state = (tokens_left, r.origin_input_len + r.num_output)
        states = self.req_states
        assert states is not None  # add_one_req_ignore_eos sets it first
        if not insert_sort:
            states.append(state)
            return
        i = 0  # SGLang's loop leaves i at the last index when no entry is larger: it inserts before the last
        for i in range(len(states)):
            if tokens_left <= states[i][0]:
                break
        states.insert(i, state)
