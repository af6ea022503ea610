"""Prefill admission on two KV pools (SGLang 0.5.23 ``SWAPrefillBudget``, ``mem_cache/prefill_budget.py``).

    rem_total  = full_available + full_evictable - total_offset      (the FULL pool, as PrefillAdder)
    rem_swa    = swa_available + swa_evictable - swa_offset
    swa_tokens = max(min(extend, chunk_limit) - window, 0) + min(extend + max_new, window) + page
    admit iff  total < rem_total  and  swa_tokens < rem_swa
A request whose ``swa_tokens`` could never fit the SWA pool (>= its size) is admitted with a chunk small
enough to leave room for its decode window; any other SWA shortfall waits. ``swa_offset`` grows by each
admitted request's ``swa_tokens``; running requests reserve nothing on the SWA side.
"""

from __future__ import annotations

from poolsim.sim.prefill_adder import CLIP_MAX_NEW_TOKENS, AddReqResult, PrefillAdder


def estimate_swa_kv_tokens(extend_input_len: int, max_new_tokens: int, sliding_window_size: int, page_size: int,
                           allocation_limit: int | None = None) -> int:
    """Peak SWA tokens one prefill (+ its decode) holds (``prefill_budget.py:27-60``)."""
    allocated = extend_input_len if allocation_limit is None else min(extend_input_len, allocation_limit)
    tail = max(allocated - sliding_window_size, 0)
    return tail + min(extend_input_len + max_new_tokens, sliding_window_size) + page_size


class SWAPrefillAdder(PrefillAdder):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.swa_offset = 0
        self.window = self.tree_cache.sliding_window_size

    def _avail(self) -> int:
        return self.allocator.full_available_size() + self.tree_cache.full_evictable_size()

    @property
    def remaining_swa(self) -> int:
        return self.allocator.swa_available_size() + self.tree_cache.swa_evictable_size() - self.swa_offset

    def swa_tokens(self, extend_len: int, max_new_tokens: int, chunk_limit: int | None = None) -> int:
        return estimate_swa_kv_tokens(extend_len, max_new_tokens, self.window, self.page_size, chunk_limit)

    def budget_state(self) -> AddReqResult:
        if self.remaining_swa <= 0:
            return AddReqResult.NO_TOKEN
        return super().budget_state()

    def _check_prefill_budget(self, req, extend_len: int, total_tokens: int) -> tuple[bool, int | None]:
        chunk_limit = self.rem_chunk_tokens
        if total_tokens >= self.rem_total_tokens:
            return False, None
        extend = self.ceil_paged_tokens(extend_len)
        max_new = min(max(req.max_new_tokens - req.num_output, 0), CLIP_MAX_NEW_TOKENS)  # _swa_new_tokens
        needed = self.swa_tokens(extend, max_new, chunk_limit)
        if needed < self.remaining_swa:
            return True, chunk_limit
        cap = 0
        if needed >= self.allocator.size_swa:  # never fits whole: shrink the chunk (swa_never_fits)
            headroom = self.swa_tokens(0, max_new)
            cap = max(0, (int(self.remaining_swa) - headroom) // self.page_size * self.page_size)
        if chunk_limit is None or cap <= 0:
            return False, None
        return True, min(chunk_limit, cap)

    def _available_chunk_tokens(self) -> int | None:
        rem = min(self.rem_chunk_tokens, int(self.rem_total_tokens), int(self.remaining_swa) - self.page_size)
        return rem if rem > 0 else None

    def _update_prefill_budget(self, prefix_len: int, extend_len: int, max_new_tokens: int) -> None:
        self.swa_offset += self.swa_tokens(self.ceil_paged_tokens(extend_len), max_new_tokens, self.rem_chunk_tokens)
        super()._update_prefill_budget(prefix_len, extend_len, max_new_tokens)
