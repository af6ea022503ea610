"""SimPy wiring: an arrival process feeds requests to one scheduler process per replica (dp rank).

Each replica's loop is SGLang's event loop. Overlap (the default): step i+1 is scheduled while step i
runs on the GPU, so step i's results (outputs, finishes, frees) land after step i+1 was planned.
Plain (``--disable-overlap-schedule``): schedule, run, process, repeat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple

import simpy

from sim.metrics import Recorder
from sim.req import Req
from sim.scheduler import Scheduler


FULL_SCAN_IDS = 1 << 16  # --check: free-list ids scanned per step, at most about this many on average


class Launch(NamedTuple):
    """A forward step on the GPU: what runs, when, and its index."""

    batch: object  # ScheduleBatch as launched (the result processor's view)
    start: float
    end: float
    step: int


@dataclass
class ReplicaState:
    scheduler: Scheduler
    wakeup: simpy.Event
    gpu_free_at: float = 0.0
    step: int = 0
    evicted_seen: int = 0


class Simulation:
    def __init__(self, schedulers: list[Scheduler], step_time: Callable, recorder: Recorder,
                 max_new_tokens_for: Callable, router: str = "round_robin", progress: Callable | None = None,
                 check_every_step: bool = False):
        self.env = simpy.Environment()
        self.replicas = [ReplicaState(s, self.env.event()) for s in schedulers]
        self.step_time = step_time
        self.recorder = recorder
        self.max_new_tokens_for = max_new_tokens_for
        self.router = router
        self.progress = progress
        self.check_every_step = check_every_step
        self.arrivals_done = self.env.event()
        self._rr = 0
        self.num_requests = 0

    # ---------------------------------------------------------------- arrivals
    def _arrivals(self, trace: Iterable):
        for treq in trace:
            delay = treq.arrival_s - self.env.now
            if delay > 0:
                yield self.env.timeout(delay)
            max_new, ignore_eos = self.max_new_tokens_for(treq)
            req = Req(treq.rid, treq, max_new, ignore_eos)
            state = self._route(req)
            req.replica = self.replicas.index(state)
            state.scheduler.now = self.env.now
            state.scheduler.add_request(req)
            self.num_requests += 1
            if not state.wakeup.triggered:
                state.wakeup.succeed()
        self.arrivals_done.succeed()

    def _route(self, req: Req) -> ReplicaState:
        if len(self.replicas) == 1:
            return self.replicas[0]
        if self.router == "cache_aware":
            from pools.radix_cache import RadixKey

            key = RadixKey(req.token_ids(max(req.seqlen - 1, 0)), req.extra_key)
            best = max(self.replicas, key=lambda r: (self._peek_match(r, key), -self._load(r)))
            return best
        state = self.replicas[self._rr % len(self.replicas)]
        self._rr += 1
        return state

    @staticmethod
    def _peek_match(state: ReplicaState, key) -> int:
        tree = state.scheduler.tree_cache
        return 0 if tree.disable else tree.match_prefix(key).prefix_len

    @staticmethod
    def _load(state: ReplicaState) -> int:
        s = state.scheduler
        return len(s.waiting_queue) + s.running_batch.batch_size()

    # ---------------------------------------------------------------- scheduler loop
    def _loop(self, state: ReplicaState):
        sched = state.scheduler
        env = self.env
        overlap = sched.config.enable_overlap
        while True:
            sched.now = env.now
            batch = sched.get_next_batch_to_run()
            launched = None
            if batch is not None:
                start = max(env.now, state.gpu_free_at)
                state.gpu_free_at = start + self.step_time(batch)
                launched = Launch(batch.copy(), start, state.gpu_free_at, state.step)
                sched.forward_ct += 1
            # overlap: this step was planned before the previous one's result landed; process that one now
            landed = sched.result_queue.pop(0) if overlap and sched.result_queue else None
            if overlap and launched is not None:
                sched.result_queue.append(launched)
            if not overlap:
                landed = launched
            if landed is not None:
                yield env.timeout(max(landed.end - env.now, 0))
                sched.now = env.now
                sched.process_batch_result(landed.batch, landed.end, landed.step)
            sched.last_batch = batch
            if launched is not None:
                self._record(state, launched)
                state.step += 1
            if self.check_every_step:
                self._check(sched, state.step)
            if launched is None and landed is None:
                # Idle: nothing runs and nothing landed, so nothing changes until a request arrives.
                sched.on_idle()
                if self.arrivals_done.triggered:
                    if not sched.has_work():
                        return
                    self._abort_stuck(sched)  # nothing runs, nothing arrives: these can never be served
                    continue
                state.wakeup = env.event()
                yield state.wakeup | self.arrivals_done

    def _abort_stuck(self, sched: Scheduler) -> None:
        for req in list(sched.waiting_queue):
            sched.abort(req)  # can never be scheduled
        sched.waiting_queue.clear()

    def _record(self, state: ReplicaState, launched) -> None:
        sched = state.scheduler
        batch, start, end, step = launched
        tree = sched.tree_cache
        pool = sched.req_to_token_pool
        mamba = getattr(pool, "mamba_allocator", None)
        evicted = tree.num_evicted_tokens - state.evicted_seen
        state.evicted_seen = tree.num_evicted_tokens
        decode_tokens = len(batch.decoding_reqs or ()) if batch.forward_mode != "decode" else batch.batch_size()
        running = pool.size - pool.available_size()  # requests holding a row: decoding, chunked, finishing
        self.recorder.on_step((
            step, sched.replica, start, end - start, batch.forward_mode, batch.batch_size(), running,
            len(sched.waiting_queue), sum(batch.extend_lens), sum(batch.cached_lens), decode_tokens,
            sched.allocator.available_size(), tree.evictable_size(), tree.protected_size(), pool.available_size(),
            mamba.available_size() if mamba is not None else 0, tree.mamba_evictable_size(),
            sched.step_retracted, len(sched.step_aborted), evicted, sched.new_token_ratio.current,
            self._partial_page_tokens(sched), sum(r.kv.kv_allocated_len for r in sched.running_batch.reqs),
        ))
        sched.step_retracted = 0
        sched.step_aborted = []
        if self.progress is not None:
            self.progress(len(self.recorder.requests), end)

    @staticmethod
    def _partial_page_tokens(sched: Scheduler) -> int:
        """Slots allocated but not yet filled in the running requests' last pages."""
        ps = sched.page_size
        if ps == 1:
            return 0
        return sum((-r.kv.kv_allocated_len) % ps for r in sched.running_batch.reqs)

    @staticmethod
    def _check(sched: Scheduler, step: int) -> None:
        """Debug mode: every pool's invariants and KV conservation
        (available + evictable + protected + request-owned == size).

        The KV free list's full scan is O(pool); on pools past FULL_SCAN_IDS ids it runs every
        pages // FULL_SCAN_IDS steps (every step on small pools), while every free is still checked
        for double frees as it happens."""
        import numpy as np

        tree, alloc, pool = sched.tree_cache, sched.allocator, sched.req_to_token_pool
        tree.check_integrity()
        if step % max(1, alloc.num_pages // FULL_SCAN_IDS) == 0:
            alloc.check_integrity()
        pool.check_integrity()
        ps = alloc.page_size
        owned = 0
        for kv in pool.row_kv.values():  # every request holding a row
            row = np.asarray(pool.req_to_token[kv.req_pool_idx, kv.cache_protected_len:kv.kv_allocated_len])
            pages = np.sort(row // ps if ps > 1 else row)
            owned += (int(np.count_nonzero(pages[1:] != pages[:-1])) + 1 if pages.size else 0) * ps  # distinct
        total = alloc.available_size() + tree.evictable_size() + tree.protected_size() + owned
        if total != sched.config.max_total_num_tokens:
            raise AssertionError(f"KV not conserved at t={sched.now}: available {alloc.available_size()} + "
                                 f"evictable {tree.evictable_size()} + protected {tree.protected_size()} + "
                                 f"owned {owned} != {sched.config.max_total_num_tokens}")

    # ---------------------------------------------------------------- run
    def run(self, trace: Iterable) -> Recorder:
        self.env.process(self._arrivals(trace))
        for state in self.replicas:
            self.env.process(self._loop(state))
        self.env.run()
        return self.recorder
