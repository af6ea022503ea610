"""SimPy wiring: an arrival process feeds requests to one scheduler process per replica (dp rank).

Each replica's loop is SGLang's event loop. Overlap (the default): step i+1 is scheduled while step i
runs on the GPU, so step i's results (outputs, finishes, frees) land after step i+1 was planned.
Plain (``--disable-overlap-schedule``): schedule, run, process, repeat.

The arrival process is bench_serving's client: open loop (send at the trace's times) or, with
``max_concurrency``, closed loop (its semaphore: a request is sent when one of the N in flight finishes), and
``Barrier`` items between phases (warm-up, back-to-back runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, NamedTuple

import simpy

from poolsim.sim.metrics import Recorder, StepRow
from poolsim.sim.req import Req
from poolsim.sim.scheduler import Scheduler

FLUSH_POLL_S = 0.001  # how often a pending /flush_cache re-checks that the server is idle
FULL_SCAN_IDS = 1 << 16  # --check: free-list ids scanned per step, at most about this many on average


class Launch(NamedTuple):
    """A forward step on the GPU: what runs, when, and its index."""

    batch: Any  # ScheduleBatch as launched (the result processor's view)
    start: float
    end: float
    step: int


KEEP = -1  # Barrier.max_concurrency: keep the current limit


class Barrier(NamedTuple):
    """Between two phases of a client: wait until every request sent so far has finished, wait ``pause_s``, then
    optionally flush the cache (``/flush_cache``). Later arrival times count from the barrier's end; the next
    phase runs with ``max_concurrency`` (None: no limit; KEEP: as before)."""

    pause_s: float = 0.0
    flush_cache: bool = False
    max_concurrency: int | None = KEEP


@dataclass
class ReplicaState:
    scheduler: Scheduler
    wakeup: simpy.Event
    gpu_free_at: float = 0.0
    step: int = 0
    evicted_seen: int = 0
    mamba_evicted_seen: int = 0
    host_seen: tuple | None = None  # HiCache: running totals at the last step row (Simulation._host_row)


class Simulation:
    def __init__(self, schedulers: list[Scheduler], step_time: Callable, recorder: Recorder,
                 max_new_tokens_for: Callable, router: str = "round_robin", progress: Callable | None = None,
                 check_every_step: bool = False, max_concurrency: int | None = None,
                 record_token_times: bool = False):
        self.env = simpy.Environment()
        self.replicas = [ReplicaState(s, self.env.event()) for s in schedulers]
        self.step_time = step_time
        # per-request CPU time outside the forward passes (AnalyticStepTime.request_cpu_s; 0 for fixed steps)
        self.request_cpu_s = float(getattr(step_time, "request_cpu_s", 0.0))
        self._in_transit = 0
        self._sending_done = False
        self.recorder = recorder
        self.max_new_tokens_for = max_new_tokens_for
        self.router = router
        self.progress = progress
        self.check_every_step = check_every_step
        self.arrivals_done = self.env.event()
        self._rr = 0
        self.num_requests = 0
        # bench_serving's asyncio.Semaphore(max_concurrency): a slot is taken at send and given back at finish
        self.slots = self._slots(max_concurrency)
        self.num_done = 0
        self._drained: simpy.Event | None = None
        self.barrier_times: list[float] = []  # when each Barrier ended (the next phase's time zero)
        recorder.on_done = self._on_done
        # rid -> the time each output token landed (bench_serving's per-token ITL); off by default (memory)
        self.token_times: dict[int, list[float]] | None = {} if record_token_times else None

    # ---------------------------------------------------------------- arrivals
    def _arrivals(self, trace: Iterable):
        offset = 0.0
        for treq in trace:
            if isinstance(treq, Barrier):
                yield from self._barrier(treq)
                offset = self.env.now
                continue
            delay = treq.arrival_s + offset - self.env.now
            if delay > 0:
                yield self.env.timeout(delay)
            if self.slots is not None:
                slot = self.slots.get(1)
                if not slot.triggered:  # a free slot is taken at once: requests sent together arrive together
                    yield slot
            max_new, ignore_eos = self.max_new_tokens_for(treq)
            req = Req(treq.rid, treq, max_new, ignore_eos)
            if self.slots is not None or offset:
                req.arrival_s = self.env.now  # the send time (bench_serving starts a request's clock here)
            self.num_requests += 1
            if self.request_cpu_s > 0:
                # HTTP, tokenizer and scheduler admission: the request reaches the scheduler later than
                # it was sent (its clock, arrival_s, started at the send); constant, so order is kept
                self._in_transit += 1
                self.env.process(self._deliver_later(req))
            else:
                self._deliver(req)
        self._sending_done = True
        if not self._in_transit:
            self.arrivals_done.succeed()

    def _deliver(self, req: Req) -> None:
        state = self._route(req)
        req.replica = self.replicas.index(state)
        state.scheduler.now = self.env.now
        state.scheduler.deliver(req)
        if not state.wakeup.triggered:
            state.wakeup.succeed()

    def _deliver_later(self, req: Req):
        yield self.env.timeout(self.request_cpu_s)
        self._deliver(req)
        self._in_transit -= 1
        if self._sending_done and not self._in_transit:
            self.arrivals_done.succeed()

    def _slots(self, limit: int | None) -> simpy.Container | None:
        return simpy.Container(self.env, limit, init=limit) if limit else None

    def _on_done(self, req: Req) -> None:
        """A request finished or was aborted: its client call returns."""
        self.num_done += 1
        if self.slots is not None:
            self.slots.put(1)
        if self._drained is not None and self.num_done == self.num_requests:
            self._drained.succeed()
            self._drained = None

    def _barrier(self, barrier: Barrier):
        if self.num_done < self.num_requests:
            self._drained = self.env.event()
            yield self._drained
        if barrier.pause_s > 0:
            yield self.env.timeout(barrier.pause_s)
        if barrier.flush_cache:
            for state in self.replicas:
                # SGLang flushes only a fully idle server; bench_serving's flush waits for that
                while state.scheduler.has_work() or state.gpu_free_at > self.env.now:
                    yield self.env.timeout(max(state.gpu_free_at - self.env.now, FLUSH_POLL_S))
                state.scheduler.flush_cache()
                state.evicted_seen = state.mamba_evicted_seen = 0  # the tree's eviction counters restart
                state.host_seen = None
        if barrier.max_concurrency != KEEP:
            self.slots = self._slots(barrier.max_concurrency)
        self.barrier_times.append(self.env.now)

    def _route(self, req: Req) -> ReplicaState:
        if len(self.replicas) == 1:
            return self.replicas[0]
        if self.router == "cache_aware":
            from poolsim.pools.mem_cache.radix_cache import RadixKey

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
            sched.recv_requests()
            batch = sched.get_next_batch_to_run()
            launched = None
            if batch is not None:
                pool = sched.req_to_token_pool  # the step's after-scheduling values, before any result lands
                scheduled = (len(sched.waiting_queue), pool.size - pool.available_size(), self._free_kv(sched))
                start = max(env.now, state.gpu_free_at)
                state.gpu_free_at = start + self.step_time(batch)
                if sched.hicache is not None:  # its loads run during this pass; later writes wait for it
                    sched.hicache.hicache.on_launch(start, state.gpu_free_at)
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
                if self.token_times is not None:
                    self._stamp_tokens(landed.batch, landed.end)
            sched.last_batch = batch
            if launched is not None:
                self._record(state, launched, scheduled)
                state.step += 1
            if self.check_every_step:
                self._check(sched, state.step)
            if launched is None and landed is None:
                # Idle: nothing runs and nothing landed, so nothing changes until a request arrives.
                sched.on_idle()
                if sched.inbox:
                    continue  # an idle loop reads the socket on its next spin (recv_requests)
                if sched.hicache is not None and sched.has_work():
                    # SGLang's idle loop keeps polling its copies: spin again when the next one is done (its
                    # lock may be what keeps the waiting requests out), or when a request arrives
                    ready = sched.hicache.hicache.next_ack_time()
                    if ready is not None:
                        state.wakeup = env.event()
                        yield state.wakeup | env.timeout(max(ready - env.now, 0.0))
                        continue
                if self.arrivals_done.triggered:
                    if not sched.has_work():
                        return
                    self._abort_stuck(sched)  # nothing runs, nothing arrives: these can never be served
                    continue
                state.wakeup = env.event()
                yield state.wakeup | self.arrivals_done

    def _stamp_tokens(self, batch, end: float) -> None:
        """A request's tokens of this step land at its end: one, or a speculative verify step's accepted run."""
        for req in batch.reqs:
            times = self.token_times.setdefault(req.rid, [])  # type: ignore[union-attr]  # only called when on
            while len(times) < req.num_output:
                times.append(end)

    def _abort_stuck(self, sched: Scheduler) -> None:
        for req in list(sched.waiting_queue):
            sched.abort(req, "never_schedulable")  # can never be scheduled
        sched.waiting_queue.clear()

    def _record(self, state: ReplicaState, launched: Launch, scheduled: tuple[int, int, int]) -> None:
        """Written after the landed result was processed: this step's own on the plain loop, the previous
        step's under overlap (reports/METRICS.md); ``scheduled``: waiting, running, available before that."""
        sched = state.scheduler
        batch, start, end, step = launched
        tree = sched.tree_cache
        pool = sched.req_to_token_pool
        mamba = getattr(pool, "mamba_allocator", None)
        evicted = tree.num_evicted_tokens - state.evicted_seen
        state.evicted_seen = tree.num_evicted_tokens
        mamba_evicted = tree.num_mamba_evicted_tokens - state.mamba_evicted_seen
        state.mamba_evicted_seen = tree.num_mamba_evicted_tokens
        decode_tokens = len(batch.decoding_reqs or ()) if batch.forward_mode != "decode" else batch.batch_size()
        running = pool.size - pool.available_size()  # requests holding a row: decoding, chunked, finishing
        waiting_scheduled, running_scheduled, available_size_scheduled = scheduled
        swa_available_size, swa_evictable_size, swa_protected_size = self._swa_sizes(sched)
        row = StepRow(
            step=step, replica=sched.replica, time_s=start, duration_s=end - start, kind=batch.forward_mode,
            batch_size=batch.batch_size(), running=running, waiting=len(sched.waiting_queue),
            prefill_tokens=sum(batch.extend_lens), cached_prefill_tokens=sum(batch.cached_lens),
            decode_tokens=decode_tokens, available_size=self._free_kv(sched), evictable_size=tree.evictable_size(),
            protected_size=tree.protected_size(), free_req_rows=pool.available_size(),
            mamba_free_slots=mamba.available_size() if mamba is not None else 0,
            mamba_evictable_states=tree.mamba_evictable_size(), swa_available_size=swa_available_size,
            swa_evictable_size=swa_evictable_size, swa_protected_size=swa_protected_size,
            retracted=sched.step_retracted, aborted=len(sched.step_aborted), evicted_tokens=evicted,
            new_token_ratio=sched.new_token_ratio.current, partial_page_tokens=self._partial_page_tokens(sched),
            row_tokens=self._row_tokens(sched), waiting_scheduled=waiting_scheduled,
            running_scheduled=running_scheduled, available_size_scheduled=available_size_scheduled,
            mamba_evicted_tokens=mamba_evicted,
        )
        # with HiCache the host tier's columns follow (sim.metrics.HOST_STEP_COLUMNS)
        self.recorder.on_step(row if sched.hicache is None else (*row, *self._host_row(state, sched.hicache)))
        sched.step_retracted = 0
        sched.step_aborted = []
        if self.progress is not None:
            self.progress(len(self.recorder.requests), end)

    @staticmethod
    def _host_row(state: ReplicaState, tree) -> tuple:
        """The host tier's step columns (sim.metrics.HOST_STEP_COLUMNS): pool use now and what moved since the
        last row."""
        totals = (tree.hicache.total_loaded, tree.hicache.total_written, tree.num_host_evicted_tokens,
                  tree.num_dropped_tokens)
        seen = state.host_seen or (0, 0, 0, 0)
        state.host_seen = totals
        return (tree.host_used_size(), len(tree.evictable_host_leaves), *(a - b for a, b in zip(totals, seen)))

    @staticmethod
    def _row_tokens(sched: Scheduler) -> int:
        """Slots allocated in the running requests' rows (a native loop when compiled: no list of boxed ints)."""
        total = 0
        for r in sched.running_batch.reqs:
            total += r.kv.kv_allocated_len
        return total

    @staticmethod
    def _partial_page_tokens(sched: Scheduler) -> int:
        """Slots allocated but not yet filled in the running requests' last pages."""
        ps = sched.page_size
        if ps == 1:
            return 0
        return sum((-r.kv.kv_allocated_len) % ps for r in sched.running_batch.reqs)

    @staticmethod
    def _free_kv(sched: Scheduler) -> int:
        """Free KV slots; on two pools (hybrid SWA) the full pool's, the SWA pool has its own columns."""
        if sched.tree_cache.supports_swa():
            return sched.allocator.full_available_size()
        return sched.allocator.available_size()

    @staticmethod
    def _swa_sizes(sched: Scheduler) -> tuple[int, int, int]:
        tree = sched.tree_cache
        if not tree.supports_swa():
            return 0, 0, 0
        return sched.allocator.swa_available_size(), tree.swa_evictable_size(), tree.swa_protected_size()

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
        available = alloc.full_available_size() if tree.supports_swa() else alloc.available_size()
        total = available + tree.evictable_size() + tree.protected_size() + owned
        if total != sched.config.max_total_num_tokens:
            raise AssertionError(f"KV not conserved at t={sched.now}: available {available} + "
                                 f"evictable {tree.evictable_size()} + protected {tree.protected_size()} + "
                                 f"owned {owned} != {sched.config.max_total_num_tokens}")
        if tree.supports_swa():
            Simulation._check_swa(sched)

    @staticmethod
    def _check_swa(sched: Scheduler) -> None:
        """The SWA pool: available + the tree's SWA data + the SWA peers requests still own == its size."""
        import numpy as np

        tree, alloc, pool = sched.tree_cache, sched.allocator, sched.req_to_token_pool
        ps = alloc.page_size
        owned = 0
        for kv in pool.row_kv.values():  # every request holding a row
            row = np.asarray(pool.req_to_token[kv.req_pool_idx, kv.cache_protected_len:kv.kv_allocated_len])
            peers = alloc.full_to_swa_index_mapping[row]
            owned += len(np.unique(peers[peers > 0] // ps)) * ps
        total = alloc.swa_available_size() + tree.swa_evictable_size() + tree.swa_protected_size() + owned
        if total != alloc.size_swa:
            raise AssertionError(f"SWA KV not conserved at t={sched.now}: available {alloc.swa_available_size()} + "
                                 f"evictable {tree.swa_evictable_size()} + protected {tree.swa_protected_size()} + "
                                 f"owned {owned} != {alloc.size_swa}")

    # ---------------------------------------------------------------- run
    def run(self, trace: Iterable) -> Recorder:
        self.env.process(self._arrivals(trace))
        for state in self.replicas:
            self.env.process(self._loop(state))
        self.env.run()
        return self.recorder
