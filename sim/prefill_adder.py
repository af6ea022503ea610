"""Prefill admission (SGLang's ``PrefillAdder`` with the fixed-pool ``PrefillBudget``; SGLANG_SPEC.md 6.2).

    avail      = available + evictable            (mamba trees: FULL evictable only)
    rem_total  = avail - total_offset             total_offset: running requests' min(remaining, 4096) x ratio
                                                  + every admitted ceil_page(extend) + page + max_new
    cur_rem    = avail - current_offset           current_offset: admitted ceil_page(extend) + page
    admit iff  extend + max_new + page < rem_total   (strictly), under a temporary lock on the prefix
Both remainders are live: locking a candidate's prefix shrinks ``evictable`` at once.
"""

from __future__ import annotations

from enum import Enum

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION


class AddReqResult(Enum):
    CONTINUE = 0
    NO_TOKEN = 1
    OTHER = 2


class PrefillAdder:
    def __init__(self, page_size: int, tree_cache, running_batch, new_token_ratio: float,
                 rem_input_tokens: int, rem_chunk_tokens: int | None, num_mixed_decode_tokens: int = 0):
        self.page_size = page_size
        self.tree_cache = tree_cache
        self.allocator = tree_cache.token_to_kv_pool_allocator
        self.new_token_ratio = new_token_ratio
        self.rem_input_tokens = rem_input_tokens - num_mixed_decode_tokens
        self.rem_chunk_tokens = None if rem_chunk_tokens is None else rem_chunk_tokens - num_mixed_decode_tokens
        self.total_offset = num_mixed_decode_tokens
        self.current_offset = num_mixed_decode_tokens
        self.can_run_list: list = []
        self.new_chunked_req = None
        self.log_hit_tokens = 0
        self.log_input_tokens = 0
        self._mamba = tree_cache.supports_mamba()
        for r in running_batch.reqs:
            ratio = 1.0 if r.ignore_eos else new_token_ratio
            self.total_offset += min(r.max_new_tokens - r.num_output, CLIP_MAX_NEW_TOKENS) * ratio

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
        rem = min(self.rem_chunk_tokens, int(self.rem_total_tokens))
        if rem <= 0:
            rem = self.rem_chunk_tokens
        cand = req.seqlen - req.prefix_len
        truncated = cand > rem
        new_len = min(cand, rem)
        req.extend_end = req.prefix_len + new_len
        self.can_run_list.append(req)
        self._update_prefill_budget(0, new_len, 0 if truncated else min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS))
        return req if truncated else None

    def add_one_req(self, req, has_chunked_req: bool) -> AddReqResult:
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
        if not total_tokens < self.rem_total_tokens:
            return AddReqResult.NO_TOKEN
        if self.rem_chunk_tokens is None and self.can_run_list and input_tokens >= self.rem_input_tokens:
            return AddReqResult.OTHER  # no chunking: only the first request may exceed the input cap
        max_new_tokens = min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS)
        is_chunked = False
        if self.rem_chunk_tokens is not None and input_tokens > self.rem_chunk_tokens:
            extend_len = self.rem_chunk_tokens // self.page_size * self.page_size
            end = (prefix_len + extend_len) // self.page_size * self.page_size
            extend_len = end - prefix_len
            if extend_len <= 0:
                return AddReqResult.OTHER
            is_chunked, max_new_tokens = True, 0
        return extend_len, max_new_tokens, is_chunked
