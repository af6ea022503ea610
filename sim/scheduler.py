"""SGLang 0.5.23's scheduler, one forward step at a time (docs/sglang.md section 6).

A step: ``get_next_batch_to_run`` (merge the last prefill into the running batch, publish the chunked
request's last chunk, try a prefill batch, otherwise ``update_running_batch``: check decode memory,
retract, allocate one slot per request), run it, ``process_batch_result`` (append tokens, finish and
release, checkpoint prompts into the tree). The overlap loop schedules step i+1 before step i's
result is processed; the plain loop processes it first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from poolsim.pools.mem_cache.allocation import checkpoint_kv_cache, match_prefix_for_req, release_kv_cache
from poolsim.pools.mem_cache.base_prefix_cache import BasePrefixCache
from poolsim.pools.mem_cache.pool.req_to_token import ReqToTokenPool
from poolsim.sim.hicache_prefill_adder import HiCachePrefillAdder
from poolsim.sim.prefill_adder import AddReqResult, PrefillAdder
from poolsim.sim.req import Req
from poolsim.sim.schedule_batch import ScheduleBatch
from poolsim.sim.schedule_policy import SchedulePolicy
from poolsim.sim.speculative import AcceptanceSampler, SpecDecodeConfig
from poolsim.sim.swa_prefill_adder import SWAPrefillAdder

INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS


@dataclass(frozen=True)
class SchedulerConfig:
    """The resolved numbers one scheduler (one dp rank) runs with."""

    page_size: int
    max_total_num_tokens: int
    max_running_requests: int
    context_len: int  # the model's context length (validation)
    max_context_len: int | None = None  # req_to_token row width; None: context_len
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int | None = 8192  # None: chunking disabled
    schedule_policy: str = "fcfs"
    schedule_conservativeness: float = 1.0
    enable_overlap: bool = True
    enable_mixed_chunk: bool = False
    scheduler_recv_interval: int = 1  # --scheduler-recv-interval: <= 1 reads the socket every iteration
    speculative: SpecDecodeConfig | None = None  # speculative decoding (EAGLE v2): None when off

    def __post_init__(self):
        if self.max_total_num_tokens % self.page_size:
            raise ValueError(f"max_total_num_tokens {self.max_total_num_tokens} is not a multiple of page_size "
                             f"{self.page_size} (SGLang floors it to whole pages)")
        if self.max_running_requests < 1 or self.max_total_num_tokens < self.page_size:
            raise ValueError(f"a server needs at least one request row and one page, got "
                             f"{self.max_running_requests} rows and {self.max_total_num_tokens} tokens")
        if self.speculative is not None and self.enable_mixed_chunk:
            raise ValueError("--enable-mixed-chunk with speculative decoding is not simulated (SGLang degrades the "
                             "running requests of a mixed step to a plain one-token decode)")


class NewTokenRatioTracker:
    def __init__(self, schedule_conservativeness: float):
        self.init = min(INIT_NEW_TOKEN_RATIO * schedule_conservativeness, 1.0)
        self.min = min(self.init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.decay = (self.init - self.min) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.current = self.init

    def decay_step(self) -> None:
        self.current = max(self.current - self.decay, self.min)

    def reset(self) -> None:
        self.current = self.init


class Scheduler:
    def __init__(self, config: SchedulerConfig, tree_cache: BasePrefixCache, req_to_token_pool: ReqToTokenPool,
                 recorder=None, replica: int = 0):
        self.config = config
        self.tree_cache = tree_cache
        self.req_to_token_pool = req_to_token_pool
        self.allocator = tree_cache.token_to_kv_pool_allocator
        self.page_size = config.page_size
        self.recorder = recorder
        self.replica = replica
        self.policy = SchedulePolicy(config.schedule_policy, tree_cache)
        self.new_token_ratio = NewTokenRatioTracker(config.schedule_conservativeness)
        self.waiting_queue: list[Req] = []
        self.inbox: list[Req] = []  # delivered, not yet read by recv_requests (--scheduler-recv-interval > 1)
        self._recv_counter = 0
        spec = config.speculative
        self.spec_reserve = spec.reserve_per_decode if spec is not None else 0
        self.spec_sampler: AcceptanceSampler | None = AcceptanceSampler(spec) if spec is not None else None
        self.running_batch = self._batch([])
        self.chunked_req: Req | None = None
        self.last_batch: ScheduleBatch | None = None
        self.result_queue: list = []  # overlap: steps launched whose result has not landed (engine.Launch)
        self.forward_ct = 0
        self.max_req_len = min(config.context_len - 1, config.max_total_num_tokens - 1)
        self.max_req_input_len = self.max_req_len - 5
        self.step_retracted = 0
        self.step_aborted: list = []
        # (time_s, running requests, KV tokens held) at each retraction; on two pools (hybrid SWA) also the pool
        # that ran short ("kv" the full one, or "swa") and the SWA KV tokens held
        self.retraction_events: list[tuple] = []
        self.now = 0.0
        self.num_finished = 0  # requests finished or aborted so far
        self._filtered_at: tuple | None = None  # (running batch, num_finished) when it last dropped finished ones
        # HiCache's tree (pools/mem_cache/hiradix_cache.py), or None: its events are polled each iteration
        self.hicache: Any = tree_cache if getattr(tree_cache, "hicache", None) is not None else None

    # ---------------------------------------------------------------- intake
    def deliver(self, req: Req) -> None:
        """A request reaches the scheduler's socket: queued at once, or, with --scheduler-recv-interval > 1,
        at the next ``recv_requests`` that reads the socket."""
        if self.config.scheduler_recv_interval > 1:
            self.inbox.append(req)
        else:
            self.add_request(req)

    def recv_requests(self) -> None:
        """The top of each event-loop iteration. With --scheduler-recv-interval N > 1, SGLang's
        SchedulerRecvSkipper (managers/scheduler_components/recv_skipper.py:58-70) adds the last batch's weight
        to a counter (decode 1, extend/mixed 1000: environ.py:675-678) and reads the socket only when the
        counter reaches N, which resets it; so while decoding a new request waits up to N steps. Without a last
        batch the weight is 1 too, but an idle loop spins in no time: it reads at once."""
        if self.config.scheduler_recv_interval <= 1:
            return
        last = self.last_batch
        if last is None:
            self._recv_counter = self.config.scheduler_recv_interval
        else:
            self._recv_counter += 1 if last.forward_mode == "decode" else 1000
        if self._recv_counter < self.config.scheduler_recv_interval:
            return
        self._recv_counter = 0
        for req in self.inbox:
            self.add_request(req)
        self.inbox.clear()

    def add_request(self, req: Req) -> bool:
        """Validate and queue a request (``_handle_generate_request``); False if it will finish as an abort.

        ``max_new_tokens`` is clipped with the original prompt length first (``init_req_max_new_tokens``); a
        prompt too long for the context or the KV pool is not dropped: it is queued with the one-token prompt
        ``[0]``, prefilled like any request, and finishes as an abort when that step's result is processed."""
        max_new = min(req.max_new_tokens, self.max_req_len - req.origin_input_len - 1)
        paged_input = -(-req.origin_input_len // self.page_size) * self.page_size
        capacity = self.config.max_total_num_tokens
        req.max_new_tokens = max(0, min(max_new, capacity - paged_input - self.page_size - 1))
        too_long = req.origin_input_len >= self.max_req_input_len
        if too_long:
            req.set_finish_with_abort("input_too_long")
        self.waiting_queue.append(req)
        return not too_long

    def abort(self, req: Req, cause: str) -> None:
        """SGLang's FINISH_ABORT: the request ends now, without output, and is reported."""
        req.finished_reason, req.aborted, req.abort_cause = "abort", True, cause
        req.finish_time = self.now
        self.num_finished += 1
        self.step_aborted.append(req)
        if self.recorder is not None:
            self.recorder.on_finish(req)

    # ---------------------------------------------------------------- scheduling
    def get_next_batch_to_run(self) -> ScheduleBatch | None:
        if self.hicache is not None:  # _process_hicache_events, first (scheduler.py:3878-3896)
            self.hicache.check_hicache_events(self.now)
        exclude: list = []
        if self.chunked_req is not None:
            exclude.append(self.chunked_req)
            if self.chunked_req.extend_end > self.chunked_req.prefix_len:
                checkpoint_kv_cache(self.chunked_req, self.tree_cache)  # stash_chunked_request
        last = self.last_batch
        running = self.running_batch
        if last is not None and last.is_extend():
            if last.chunked_req is not None:
                exclude.append(last.chunked_req)
            last_bs = last.batch_size()
            last.filter_batch(reqs_to_exclude=exclude)
            if last.batch_size() < last_bs:
                running.batch_is_full = False
            if not last.is_empty() and last is not running:
                if running.is_empty():
                    running = self._batch(last.reqs)
                else:
                    running.merge_batch(last)
        if self._filtered_at != (running, self.num_finished):
            bs = running.batch_size()
            running.filter_batch()
            if running.batch_size() < bs:
                running.batch_is_full = False
        # No request of this batch can finish but through _finish/abort (which count): until the count moves, a
        # filter would keep every request (what merges add comes filtered too).
        self._filtered_at = (running, self.num_finished)
        self.running_batch = running

        new_batch = self.get_new_batch_prefill()
        if new_batch is not None:
            return new_batch
        if not self.running_batch.is_empty():
            batch = self.update_running_batch(self.running_batch)
            return batch if batch is not None and not batch.is_empty() else None
        return None

    def _batch(self, reqs: list, forward_mode: str = "decode") -> ScheduleBatch:
        return ScheduleBatch(reqs, self.tree_cache, self.req_to_token_pool, forward_mode, self.spec_reserve)

    def _num_allocatable_reqs(self, num_held_rows: int = 0) -> int:
        pp_budget = self.config.max_running_requests - self.running_batch.batch_size()
        return min(pp_budget, max(self.req_to_token_pool.available_size() + num_held_rows, 0))

    def get_new_batch_prefill(self) -> ScheduleBatch | None:
        running = self.running_batch
        if running.is_empty():
            running.batch_is_full = False
        if (running.batch_is_full or not self.waiting_queue) and self.chunked_req is None:
            return None
        if self._num_allocatable_reqs() <= 0 and self.chunked_req is None:
            running.batch_is_full = True
            return None
        self.policy.calc_priority(self.waiting_queue)
        mixed = self.config.enable_mixed_chunk
        adder_cls = SWAPrefillAdder if self.tree_cache.supports_swa() else \
            HiCachePrefillAdder if self.hicache is not None else PrefillAdder
        adder = adder_cls(self.page_size, self.tree_cache, running, self.new_token_ratio.current,
                             self.config.max_prefill_tokens, self.config.chunked_prefill_size,
                             running.batch_size() if mixed else 0)
        continuing = self.chunked_req
        if self.chunked_req is not None:
            self.chunked_req = adder.add_chunked_req(self.chunked_req)

        mamba_allocator = getattr(self.req_to_token_pool, "mamba_allocator", None)
        if mamba_allocator is not None:
            mamba_allocator.alloc_group_begin(len(self.waiting_queue))
        for req in self.waiting_queue:
            if adder.budget_state() == AddReqResult.OTHER:
                break
            held = sum(r.kv.holds_kv for r in adder.can_run_list)
            if len(adder.can_run_list) >= self._num_allocatable_reqs(held):
                running.batch_is_full = True
            if running.batch_is_full:
                break
            match_prefix_for_req(req, self.tree_cache)  # init_next_round_input: match capped at len - 1
            res = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None)
            if res != AddReqResult.CONTINUE:
                if res == AddReqResult.NO_TOKEN:
                    running.batch_is_full = bool(adder.can_run_list) or not running.is_empty()
                added = bool(adder.can_run_list) and req is adder.can_run_list[-1]
                if not added:  # a copy-on-write slot taken at match time goes back
                    req.kv.mamba_cow_src_index = None
                    if req.kv.holds_mamba and mamba_allocator is not None:
                        mamba_allocator.free([req.kv.mamba_pool_idx])
                        req.kv.mamba_pool_idx = None
                break
        if mamba_allocator is not None:
            mamba_allocator.alloc_group_end()

        can_run = adder.can_run_list
        if not can_run:
            return None
        # The loop admits in queue order and stops at the first request it turns away, so the admitted
        # ones (less the continuing chunked request, which is not queued) are the head of the queue.
        num_admitted = len(can_run) - (continuing is not None)
        if num_admitted and self.waiting_queue[num_admitted - 1] is can_run[-1]:
            del self.waiting_queue[:num_admitted]  # in place: a memmove, not a copy of the long queue
        elif num_admitted:
            chosen = set(map(id, can_run))
            self.waiting_queue = [r for r in self.waiting_queue if id(r) not in chosen]
        if adder.new_chunked_req is not None:
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.inflight_middle_chunks += 1
        for r in can_run:
            if r is not continuing:
                r.cached_tokens.append(r.prefix_len)
                r.admission_steps.append(self.forward_ct)
            r.is_retracted = False
        if self.hicache is not None:  # the load-backs admission queued start with this batch (scheduler.py:4351)
            self.hicache.ready_to_load_host_cache()
        batch = self._batch(can_run, "extend")
        batch.cached_lens = [0 if r is continuing else r.prefix_len for r in can_run]
        batch.chunked_req = self.chunked_req
        batch.prepare_for_extend()
        if mixed and not running.is_empty():
            finishing = self._reqs_finishing_inflight(running)
            running.filter_batch(reqs_to_exclude=finishing)
            if finishing:
                running.batch_is_full = False
            if not running.is_empty() and running.check_decode_mem():
                running.prepare_for_decode()
                batch.mix_with_running(running)
                self.running_batch = self._batch([])
                self.running_batch.batch_is_full = running.batch_is_full
        return batch

    def _reqs_finishing_inflight(self, batch: ScheduleBatch) -> list:
        """Overlap: requests whose queued (unprocessed) result finishes them by length skip this step."""
        if not self.config.enable_overlap or not self.result_queue:
            return []
        near_end = [r for r in batch.reqs if r.num_output + 1 >= r.max_new_tokens]  # next_output_finishes_by_length
        if not near_end:
            return near_end
        queued = set(self.result_queue[0].batch.reqs)  # Req hashes and compares by identity
        return [r for r in near_end if r in queued]

    def update_running_batch(self, batch: ScheduleBatch) -> ScheduleBatch | None:
        initial_bs = batch.batch_size()
        finishing = self._reqs_finishing_inflight(batch)
        if finishing:  # without, a no-op: get_next_batch_to_run has just dropped the finished requests
            batch.filter_batch(reqs_to_exclude=finishing)
        if batch.is_empty():
            batch.batch_is_full = False
            return batch
        full = not batch.check_decode_mem()
        if full and finishing:
            batch.batch_is_full = False  # the queued result frees their KV this step
            return None
        if full:
            swa = self.tree_cache.supports_swa()
            free = self.allocator.full_available_size() if swa else self.allocator.available_size()
            held = self.config.max_total_num_tokens - free - self.tree_cache.evictable_size()
            if swa:  # the pool that ran short (check_decode_mem asked min(full, SWA) free after evicting both)
                need = batch.new_tokens_required_next_decode()
                short_pool = "kv" if self.allocator.full_available_size() < need else "swa"
                swa_held = self.allocator.size_swa - self.allocator.swa_available_size() - \
                    self.tree_cache.swa_evictable_size()
                self.retraction_events.append((self.now, batch.batch_size(), held, short_pool, swa_held))
            else:
                self.retraction_events.append((self.now, batch.batch_size(), held))
            retracted, ratio, aborted = batch.retract_decode()
            self.new_token_ratio.current = ratio
            self.step_retracted += len(retracted)
            for req in aborted:  # even the last request could not decode: its KV is already released
                self.abort(req, "decode_out_of_memory")
            self.waiting_queue.extend(retracted)
        else:
            self.new_token_ratio.decay_step()
        if batch.batch_size() < initial_bs:
            batch.batch_is_full = False
        if batch.is_empty():
            return batch
        batch.prepare_for_decode()
        return batch

    # ---------------------------------------------------------------- results
    def process_batch_result(self, batch: ScheduleBatch, end_time: float, step: int) -> None:
        self.allocator.free_group_begin()
        try:
            if batch.is_extend():
                self._process_prefill_result(batch, end_time, step)
            else:
                if self.spec_sampler is not None:
                    self.spec_sampler.decode_steps += 1
                self._process_decode_reqs(batch.reqs, end_time, step, batch.mamba_tracks)
        finally:
            self.allocator.free_group_end()
        if self.hicache is not None:  # submit this batch's queued host backups (scheduler.py:5105-5106)
            self.hicache.flush_pending_backups(self.now)

    def _process_prefill_result(self, batch: ScheduleBatch, end_time: float, step: int) -> None:
        decoding = set(map(id, batch.decoding_reqs or ()))
        for req in batch.reqs:
            if id(req) in decoding:
                if not (self.config.enable_overlap and (req.finished() or req.is_retracted)):
                    self._process_decode_reqs([req], end_time, step, batch.mamba_tracks)
                continue
            if (req.finished() and req.inflight_middle_chunks <= 0) or req.is_retracted:
                continue
            if req.inflight_middle_chunks <= 0:
                req.append_output()
                if req.first_token_time is None:
                    req.first_token_time, req.first_token_step = end_time, step
                if req.finished():
                    self._finish(req, end_time, step)
                else:
                    checkpoint_kv_cache(req, self.tree_cache)
            else:
                req.inflight_middle_chunks -= 1

    def _process_decode_reqs(self, reqs: list[Req], end_time: float, step: int,
                             mamba_tracks: dict | None = None) -> None:
        overlap = self.config.enable_overlap
        tracks: dict = mamba_tracks or {}
        commit = self.tree_cache.commit_decode_track if tracks else None
        sampler = self.spec_sampler
        for req in reqs:
            if overlap and (req.finished_reason is not None or req.is_retracted):
                continue  # a finished request rode one extra step: its slot is freed at release
            if sampler is not None:  # the verify pass commits the accepted run (batch_result_processor.py:818-850)
                n = sampler.draw(req.rid, req.num_output)
                req.kv.kv_committed_len += n
                req.append_outputs(n)
            else:
                req.append_output()
            if commit is not None:  # the decode checkpoint counts from its result on
                track = tracks.get(req)
                if track is not None:
                    commit(req, track)
            if req.finished_reason is not None:
                self._finish(req, end_time, step)

    def _finish(self, req: Req, end_time: float, step: int) -> None:
        owned = req.owned_kv_len()
        release_kv_cache(req, self.tree_cache, checkpoint=True)
        req.tokens_not_cached = owned - min(req.kv.cache_protected_len, owned)
        req.finish_time, req.finish_step = end_time, step
        self.num_finished += 1
        req.drop_token_cache()
        if req.aborted:
            self.step_aborted.append(req)
        if self.recorder is not None:
            self.recorder.on_finish(req)

    def flush_cache(self) -> None:
        """``/flush_cache`` on an idle server (scheduler.py flush_cache): empty tree, pools and slots."""
        if self.has_work():
            raise RuntimeError("flush_cache needs an idle server (no queued or running requests)")
        self.last_batch = None
        self.tree_cache.reset()
        self.req_to_token_pool.clear()
        mamba = getattr(self.req_to_token_pool, "mamba_allocator", None)
        if mamba is not None:
            mamba.clear()
        self.allocator.clear()

    def on_idle(self) -> None:
        self.new_token_ratio.reset()

    def has_work(self) -> bool:
        return bool(self.waiting_queue) or not self.running_batch.is_empty() or self.chunked_req is not None \
            or bool(self.result_queue) or bool(self.inbox)
