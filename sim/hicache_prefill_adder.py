"""Prefill admission with a host tier (``PrefillAdder.add_one_req`` with HiCache, ``managers/schedule_policy.py:1395-
1590``): a candidate whose match ends in host-only nodes is admitted as if its host hit were cached (the extend
starts after it), then, with its device prefix still locked and its best match node host-locked, the host hit is
loaded back (``init_load_back``); a load that does not happen (a hit under ``load_back_threshold``, or no device
room) re-selects the admission with no host hit, so those tokens are recomputed.
"""

from __future__ import annotations

from poolsim.sim.prefill_adder import CLIP_MAX_NEW_TOKENS, AddReqResult, PrefillAdder


class HiCachePrefillAdder(PrefillAdder):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log_host_hit_tokens = 0  # prompt tokens loaded back from host for this batch

    def add_one_req(self, req, has_chunked_req: bool) -> AddReqResult:
        if req.host_hit_length <= 0:
            return super().add_one_req(req, has_chunked_req)
        tree = self.tree_cache
        max_new = min(max(req.max_new_tokens - req.num_output, 0), CLIP_MAX_NEW_TOKENS)
        total_tokens = req.seqlen - req.prefix_len + max_new + self.page_size
        lock = tree.lock(req.last_node)  # _lock_node(req.last_node): the device prefix is not budget
        try:
            admission = self._select_with_host_hit(req, total_tokens, req.host_hit_length)
            if isinstance(admission, AddReqResult):
                return admission
            host_lock = tree.inc_host_lock_ref(req.best_match_node)  # _lock_node(best_match_node, lock_host=True)
            try:
                loaded = tree.init_load_back(req)
            finally:
                tree.dec_host_lock_ref(host_lock)
            if loaded:
                req.prefix_len += loaded
                req.kv.cache_protected_len = req.prefix_len  # load_back_is_cache_owned
                req.host_loaded_tokens += loaded
                self.log_host_hit_tokens += loaded
            else:  # no FULL loaded: recomputation may no longer fit (schedule_policy.py:1561-1571)
                admission = self._select_with_host_hit(req, total_tokens, 0)
                if isinstance(admission, AddReqResult):
                    return admission
            extend_len, max_new_tokens, is_chunked = admission
            if loaded:  # the extend was chosen against prefix + host hit: it starts where the load ends
                extend_len = min(extend_len, req.seqlen - req.prefix_len)
            req.extend_end = req.prefix_len + extend_len
            req.lock = tree.lock(req.last_node)
            self.can_run_list.append(req)
            if is_chunked:
                self.new_chunked_req = req
            self._update_prefill_budget(req.prefix_len, extend_len, max_new_tokens)
        finally:
            tree.unlock(lock)
        return self.budget_state()

    def _select_with_host_hit(self, req, total_tokens: int, host_hit: int):
        """``_select_prefill_admission`` with ``prefix_len = req.prefix_len + host_hit`` (``:1592-1683``)."""
        req.prefix_len += host_hit
        try:
            return self._select_prefill_admission(req, total_tokens)
        finally:
            req.prefix_len -= host_hit
