"""The radix cache with a host tier (HiCache), as SGLang 0.5.23 runs it: ``UnifiedRadixCache`` with its FULL component
after ``init_hicache`` (``srt/mem_cache/unified_radix_cache.py:455-592``), the Python tree core's host-aware walks
(``unified_cache/unified_tree_core.py``) and the cache controller's queues and acknowledgements
(``hybrid_cache/hybrid_cache_controller.py``, ``managers/cache_controller.py``). The class is named after SGLang's
historical ``HiRadixCache``, which 0.5.23 folded into ``UnifiedRadixCache``.

A node holds device slots (``value``), host slots (``host_value``) or both; ``value is None`` is SGLang's
``evicted`` (host-only), ``host_value is not None`` its ``backuped``. What is exact (slot for slot, as 0.5.23's
code does it):

- **Write policy** (``init_hicache``, ``:563-569``; ``_inc_hit_count_and_check``, ``unified_tree_core.py:1104-1123``):
  an insert walk counts a hit on every node it passes that ends past the request's ``cache_inserted_len`` (and on
  the new leaf); a device node not yet on host is backed up when its hit count reaches 1 (``write_through``) or 2
  (``write_through_selective``). ``write_back`` counts nothing and backs up a node only when device eviction
  reaches it (``evict_device_leaf``, ``:1788-1823``), synchronously (``writing_check(write_back=True)``).
- **A write-through backup** (``_build_backup_kv_action``, ``:2622-2644``; ``_execute_and_commit_kv_backup``,
  ``unified_radix_cache.py:1681-1716``) chains the node's unbacked ancestors, ancestors first; each takes its host
  slots at once (evicting host leaves for them, ``_execute_kv_backup`` ``:1737-1762``; a chain stops silently at
  the first node the host pool cannot take), and is locked until its acknowledgement is processed by a later
  ``check_hicache_events`` (``writing_check``, ``:3472-3513``). Acks are processed in submission order, all the
  writes of one ``start_writing`` together.
- **Device eviction** (``_evict_components``, ``:952-1058``): LRU device leaves (a device leaf: device slots and no
  child with device slots); a leaf with a host copy is demoted (device slots freed, the node stays host-only,
  ``_demote`` ``:2090-2123``); one without is deleted (``write_through``) or first written back (``write_back``);
  a write-back the host cannot take drops the node and its host-only subtree (``drop_subtree_no_host``).
- **Host eviction** (``evict_host`` -> ``drive_host_eviction``, ``components/full.py:250-280``): LRU host leaves
  (host-only, no children, unlocked on both tiers), whole nodes, until the request is met; the parent of an
  evicted node becomes a candidate. Under ``write_back`` the host copies of nodes also on device are reclaimed
  first, in registration order (``_reclaim_full_host_duplicates``, ``:1975-2006``).
- **Match** (``_match_prefix_helper``, ``:905-984``; ``finalize_match_result_in_tree_core``, ``full.py:123-145``):
  the walk continues through host-only nodes; ``prefix_len`` is the device prefix, ``host_hit_length`` the host
  tokens between the deepest device node and the deepest matched node (``best_match_node``), whose root path is
  stamped as recently used.
- **Load-back** (``init_load_back`` / ``load_back``, ``unified_radix_cache.py:1820-1937``, ``:3586-3624``): a host
  hit of at least ``load_back_threshold`` = 10 tokens gets device slots (evicting for them), its nodes become
  device nodes again (keeping their host copies) and stay locked until the load's acknowledgement; a shorter one is
  recomputed. An insert that meets a host-only node adopts the request's fresh slots for it
  (``_unevict_node_on_insert``, ``:1564-1590``).

What is modelled (the controller below): when a copy completes. A D->H copy starts when it is submitted
(``start_writing``), after the forward pass running then (the write fence, ``managers/scheduler.py:616-623``) and
after earlier copies on the link, and takes ``bytes / bandwidth``; its ack is ready from then on. A load's ack is
ready when its layer-wise copy ends (the step-time model overlaps it with the forward it serves). The storage tier
(L3) is not simulated.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from poolsim.pools.backend.numpy_backend import NUMPY_BACKEND
from poolsim.pools.errors import PoolError
from poolsim.pools.mem_cache.pool_host.base import HostKVCache
from poolsim.pools.mem_cache.radix_cache import InsertResult, MatchResult, RadixCache, RadixKey, TreeNode

LOAD_BACK_THRESHOLD = 10  # tokens; unified_radix_cache.py:574
WRITE_THROUGH_THRESHOLDS = {"write_through": 1, "write_through_selective": 2}  # unified_radix_cache.py:563-565
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")


class HiTreeNode(TreeNode):
    """A node with SGLang's host fields (``UnifiedTreeNode``, ``unified_tree_core.py:112-157``)."""

    __slots__ = ("host_value", "hit_count", "pending_ack", "host_lock_ref", "load_back_pending")

    def __init__(self, node_id, key, value, parent, extra_key=None):
        super().__init__(node_id, key, value, parent, extra_key)
        self.host_value: np.ndarray | None = None
        self.hit_count = 0
        self.pending_ack: int | None = None  # write_through_pending_id: the ack that will release this copy
        self.host_lock_ref = 0
        self.load_back_pending: int | None = None  # write_back: the load-back anchor reading these host slots

    def __repr__(self) -> str:
        where = ("D" if self.value is not None else "") + ("H" if self.host_value is not None else "")
        return f"HiTreeNode(id={self.id}, len={len(self.key)}, {where}, lock={self.lock_ref}, hits={self.hit_count})"


class HiCacheController:
    """SGLang's cache controller as far as the tree sees it: queued writes and loads, their acknowledgements and
    the link they share (modelled time; see the module docstring). ``bandwidth``: effective B/s per direction."""

    def __init__(self, size_per_token: int, bandwidth: float = float("inf")):
        self.size_per_token = size_per_token
        self.bandwidth = bandwidth
        self.clear()

    def clear(self) -> None:
        self.write_queue: list[tuple[int, int]] = []  # (node id, tokens) written, not yet submitted
        self.ack_write_queue: list[tuple[float, list[int]]] = []  # (ready time, node ids) in submission order
        self.load_queue: list[tuple[int, int]] = []  # (anchor id, tokens) loaded, not yet submitted
        self.ack_load_queue: list[list] = []  # [ready time, anchor ids]; ready time None until its step launches
        self.d2h_free_at = 0.0  # when the D->H link is next idle
        self.forward_busy_until = 0.0  # the end of the latest forward pass launched (the write fence)
        self.step_loaded = 0  # tokens loaded for the batch being scheduled (ready_to_load_host_cache)
        self.step_stall_s = 0.0  # blocking write-back copies while this batch was scheduled
        self.total_written = self.total_loaded = 0

    def transfer_s(self, tokens: int) -> float:
        return tokens * self.size_per_token / self.bandwidth if tokens else 0.0

    def start_writing(self, now: float) -> None:
        """Submit the queued writes as one merged copy (``start_writing``, ``cache_controller.py:885-920``)."""
        if not self.write_queue:
            return
        tokens = sum(n for _, n in self.write_queue)
        start = max(now, self.forward_busy_until, self.d2h_free_at)
        self.d2h_free_at = start + self.transfer_s(tokens)
        self.ack_write_queue.append((self.d2h_free_at, [i for i, _ in self.write_queue]))
        self.total_written += tokens
        self.write_queue = []

    def ready_write_acks(self, now: float) -> int:
        n = 0
        for ready, _ in self.ack_write_queue:  # _count_ready_acks: stops at the first one not done
            if ready > now:
                break
            n += 1
        return n

    def start_loading(self) -> int:
        """Submit the queued loads (``start_loading``, ``cache_controller.py:1028-1069``); -1 when none."""
        if not self.load_queue:
            return -1
        tokens = sum(n for _, n in self.load_queue)
        self.ack_load_queue.append([None, [i for i, _ in self.load_queue], tokens])
        self.load_queue = []
        self.step_loaded += tokens
        self.total_loaded += tokens
        return len(self.ack_load_queue) - 1

    def on_launch(self, start: float, end: float) -> None:
        """A forward pass launched on the GPU: the loads submitted for it complete during it (layer by layer,
        the last at ``start`` + their copy time, or with the pass); later writes wait for it (the write fence)."""
        for ack in self.ack_load_queue:
            if ack[0] is None:
                ack[0] = min(start + self.transfer_s(ack[2]), end) if self.bandwidth != float("inf") else start
        self.forward_busy_until = max(self.forward_busy_until, end)

    def ready_load_acks(self, now: float) -> int:
        n = 0
        for ready, _, _ in self.ack_load_queue:
            if ready is None or ready > now:
                break
            n += 1
        return n

    def next_ack_time(self) -> float | None:
        """When the oldest pending copy is acknowledged (None: none pending, or a load whose pass has not run)."""
        times = [self.ack_write_queue[0][0]] if self.ack_write_queue else []
        if self.ack_load_queue and self.ack_load_queue[0][0] is not None:
            times.append(self.ack_load_queue[0][0])
        return min(times) if times else None

    def pop_step_io(self) -> tuple[int, float]:
        """(tokens loaded for, blocking write-back seconds during) the batch just scheduled; resets both."""
        out = (self.step_loaded, self.step_stall_s)
        self.step_loaded, self.step_stall_s = 0, 0.0
        return out


class HiRadixCache(RadixCache):
    """``RadixCache`` with HiCache's host tier (FULL component: MHA and MLA models)."""

    def __init__(self, req_to_token_pool, token_to_kv_pool_allocator, host_pool: HostKVCache,
                 write_policy: str = "write_through", page_size: int | None = None,
                 bandwidth: float = float("inf")):
        if write_policy not in WRITE_POLICIES:
            raise PoolError(f"hicache write policy {write_policy!r} is not one of {', '.join(WRITE_POLICIES)}")
        self.host_pool = host_pool
        self.write_policy = write_policy
        self.is_write_back = write_policy == "write_back"
        self.write_through_threshold = WRITE_THROUGH_THRESHOLDS.get(write_policy, 0)
        self.load_back_threshold = LOAD_BACK_THRESHOLD
        self.hicache = HiCacheController(host_pool.size_per_token, bandwidth)
        self.now = 0.0
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size)

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        super().reset()
        self.evictable_host_leaves: set[HiTreeNode] = set()
        self._host_heap: list = []
        self.ongoing_write_through: dict[int, list] = {}  # ack id -> [lock node, published nodes]
        self.ongoing_load_back: dict[int, tuple] = {}  # anchor id -> (anchor node, its lock)
        self.full_host_duplicates: dict[int, HiTreeNode] = {}  # write_back: device + host copies, in birth order
        self._inserted_len = 0
        self.host_pool.clear()
        self.hicache.clear()
        # running totals (tokens), for metrics
        self.num_demoted_tokens = 0  # device copies freed, host copy kept
        self.num_dropped_tokens = 0  # device copies freed with no host copy: gone
        self.num_host_evicted_tokens = 0  # host copies freed
        self.num_backup_skipped_tokens = 0  # write-through backups the host pool could not take
        self.num_load_back_tokens = 0
        self.num_recomputed_host_tokens = 0  # host hits under the load-back threshold (or refused), recomputed

    def _new_node(self, key, value, parent, extra_key=None) -> HiTreeNode:
        node = HiTreeNode(self._next_id, key, value, parent, extra_key)
        self._next_id += 1
        node.last_access_time = self._tick()
        self._tick()  # creation_time
        return node

    def host_used_size(self) -> int:
        return self.host_pool.size - self.host_pool.available_size()

    # ------------------------------------------------------------------ leaves
    def _is_leaf(self, node) -> bool:
        """A device leaf (``_is_device_leaf``, ``unified_tree_core.py:2348-2364``)."""
        if node is self.root_node or node.value is None or node.lock_ref:
            return False
        for child in node.children.values():
            if child.value is not None:
                return False
        return True

    def _is_host_leaf(self, node) -> bool:
        """``_is_host_leaf`` (``unified_tree_core.py:2366-2387``)."""
        return (node is not self.root_node and node.value is None and node.host_value is not None
                and not node.host_lock_ref and not node.lock_ref and not node.children)

    def _update_leaf_status(self, node) -> None:
        super()._update_leaf_status(node)
        if node is self.root_node:
            return
        if self._is_host_leaf(node):
            if node not in self.evictable_host_leaves:
                self.evictable_host_leaves.add(node)
                heapq.heappush(self._host_heap, (node.last_access_time, node.id, node))
        else:
            self.evictable_host_leaves.discard(node)

    def _touch(self, node, t: float) -> None:
        if t < node.last_access_time and node in self.evictable_host_leaves:
            heapq.heappush(self._host_heap, (t, node.id, node))
        super()._touch(node, t)

    # ------------------------------------------------------------------ split
    def _split_node(self, child, split_len: int):
        """``_split_node`` (``unified_tree_core.py:1467-1530``) with the host fields: both copies are cut, the new
        parent inherits the hit count, locks, a pending write's ack and a load-back pin."""
        parent = child.parent
        extra = child.extra_key
        value = None if child.value is None else child.value[:split_len]
        new = self._new_node(child.key[:split_len], value, parent, extra)
        new.lock_ref = child.lock_ref
        new.host_lock_ref = child.host_lock_ref
        new.hit_count = child.hit_count
        new.load_back_pending = child.load_back_pending
        if child.host_value is not None:
            new.host_value = child.host_value[:split_len]
            child.host_value = child.host_value[split_len:]
        child.key = child.key[split_len:]
        if child.value is not None:
            child.value = child.value[split_len:]
        child.parent = new
        new.children[self._child_key(child.key, extra)] = child
        assert parent is not None  # the root is never split
        parent.children[self._child_key(new.key, extra)] = new
        if child.pending_ack is not None:  # UpdatePendingBackupOnNodeSplit: the ack publishes both fragments
            new.pending_ack = child.pending_ack
            published = self.ongoing_write_through[child.pending_ack][1]
            i = published.index(child)
            published[i:i + 1] = [new, child]
        self._touch(child, self._tick())
        self._update_leaf_status(new)
        self._update_leaf_status(child)
        self._update_duplicate_tracking(new)
        return new

    # ------------------------------------------------------------------ match
    def match_prefix(self, key: RadixKey, req=None, **kwargs):
        """Device prefix, and the host hit behind it (stored on ``req`` when given: ``host_hit_length`` and
        ``best_match_node``, as ``match_kv_cache`` does, ``common.py:244-259``)."""
        key = key.page_aligned(self.page_size)
        best = self.root_node
        device_values: list = []
        host_hit = full_hit = 0
        if len(key):
            path, _, full_hit = self._walk(key.token_ids, key.extra_key)
            for node in path:
                if node.value is None:
                    host_hit += len(node.host_value)
                else:
                    device_values.append(node.value)
            if path:
                best = path[-1]
            self._touch_match(best)
        last_device = best
        while last_device.value is None:
            last_device = last_device.parent
        if req is not None:
            req.host_hit_length = host_hit
            req.best_match_node = best
        return MatchResult(tuple(device_values), sum(map(len, device_values)), last_device, full_hit)

    def _match_valid(self, node) -> bool:
        return True  # a host-only node is a valid match end (components/full.py:118-121)

    # ------------------------------------------------------------------ locks
    def inc_lock_ref(self, node) -> int:
        """FULL ``acquire_component_lock`` (``components/full.py:282-329``): the host-only bottom of the path is
        locked without moving tokens between the device ledgers."""
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 0 and node.value is not None:
                n = len(node.value)
                self.evictable_size_ -= n
                self.protected_size_ += n
                delta += n
            node.lock_ref += 1
            self.evictable_leaves.discard(node)
            self.evictable_host_leaves.discard(node)
            node = node.parent
        return delta

    def dec_lock_ref(self, node) -> int:
        delta = 0
        while node is not self.root_node:
            if node.lock_ref <= 0:
                raise PoolError(f"unlock of node {node.id} whose lock_ref is already 0")
            if node.lock_ref == 1 and node.value is not None:
                n = len(node.value)
                self.evictable_size_ += n
                self.protected_size_ -= n
                delta += n
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._update_leaf_status(node)
            node = node.parent
        return delta

    def inc_host_lock_ref(self, node) -> Any:
        """A host lock on one node (``lock_host=True``: "only the last host node needs to be protected")."""
        if node is self.root_node or (node.host_value is None and not self.is_write_back):
            return None
        node.host_lock_ref += 1
        self.evictable_host_leaves.discard(node)
        return node

    def dec_host_lock_ref(self, lock) -> None:
        if lock is None:
            return
        if lock.host_lock_ref <= 0:
            raise PoolError(f"host unlock of node {lock.id} whose host_lock_ref is already 0")
        lock.host_lock_ref -= 1
        self._update_leaf_status(lock)

    # ------------------------------------------------------------------ insert
    def checkpoint(self, req, up_to: int) -> None:
        self._inserted_len = req.kv.cache_inserted_len  # InsertParams.inserted_len (unified_radix_cache.py:1184)
        try:
            super().checkpoint(req, up_to)
        finally:
            self._inserted_len = 0

    def insert(self, key: RadixKey, value, prev_prefix_len: int = 0, mamba_value: int | None = None,
               from_node=None) -> InsertResult:
        """The insert walk of ``unified_tree_core.py:1282-1465`` over host-aware nodes: overlapped device nodes free
        the caller's duplicates, host-only nodes adopt the caller's slots, hits are counted past ``inserted_len``
        and a node reaching the write-through threshold is backed up before the walk goes on."""
        key = key.page_aligned(self.page_size)
        if not isinstance(value, np.ndarray):
            value = np.asarray(value, dtype=np.int64)
        value = value[: len(key)]
        self._touch(self.root_node, self._tick())
        if len(key) == 0:
            return InsertResult(0, self.root_node, mamba_exist=True)
        tokens, extra = key.token_ids, key.extra_key
        inserted_len = self._inserted_len
        alloc = self.token_to_kv_pool_allocator
        node, pos = self.root_node, 0
        while pos < len(tokens):
            child = node.children.get(self._child_key(tokens[pos:], extra))
            if child is None:
                break
            self._touch(child, self._tick())
            plen = self._match_len(child.key, tokens[pos:])
            if plen < len(child.key):
                child = self._split_node(child, plen)
            if child.value is None:
                self._unevict(child, value[pos: pos + plen])
            else:
                dup_start = max(0, prev_prefix_len - pos)
                if dup_start < plen:
                    alloc.free_segment(value[pos + dup_start: pos + plen], start_pos=0)
            if pos + plen > inserted_len and self._inc_hit_count_and_check(child):
                self._write_through(child)
            node = child
            pos += plen
        if pos < len(tokens):
            slots = np.array(value[pos:], dtype=np.int64)
            slots.flags.writeable = False
            target = self._add_new_node(node, NUMPY_BACKEND.keep(tokens[pos:]), slots, extra)
            if len(tokens) > inserted_len and self._inc_hit_count_and_check(target):
                self._write_through(target)
        else:
            target = node
        return InsertResult(pos, target, False)

    def _unevict(self, node, fresh) -> None:
        """``_unevict_node_on_insert``: a host-only node takes the inserting request's freshly computed slots."""
        slots = np.array(fresh, dtype=np.int64)
        slots.flags.writeable = False
        node.value = slots
        if node.lock_ref > 0:
            self.protected_size_ += len(slots)
        else:
            self.evictable_size_ += len(slots)
        self._update_leaf_status(node)
        self._update_duplicate_tracking(node)
        self._update_leaf_status(node.parent)

    def _inc_hit_count_and_check(self, node) -> bool:
        if node.value is None or self.is_write_back:
            return False
        node.hit_count += 1
        return node.host_value is None and node.hit_count >= self.write_through_threshold

    # ------------------------------------------------------------------ backups
    def _write_through(self, node) -> None:
        """``_build_backup_kv_action`` + ``_execute_and_commit_kv_backup``: the node and its unbacked ancestors,
        ancestors first, each locked until its ack; stops at the first one the host pool cannot take."""
        chain = [node]
        a = node.parent
        while a is not self.root_node and a.host_value is None:
            chain.append(a)
            a = a.parent
        for target in reversed(chain):
            if target.host_value is not None:
                continue
            if not self._backup(target):
                self.num_backup_skipped_tokens += len(target.value)
                return
            self.inc_lock_ref(target)  # the write-through lock (unified_radix_cache.py:1710-1711)

    def _backup(self, node) -> bool:
        """``_execute_kv_backup`` (``unified_radix_cache.py:1737-1762``): host slots now (evicting host leaves for
        them), the copy queued; False when the host pool cannot hold it."""
        n = len(node.value)
        avail = self.host_pool.available_size()
        if avail < n and self.evict_host(n - avail) < n - avail:
            return False
        host = self.host_pool.alloc(n)
        if host is None:
            return False
        node.host_value = host
        node.pending_ack = node.id
        self.ongoing_write_through[node.id] = [node, [node]]
        self.hicache.write_queue.append((node.id, n))
        self._update_leaf_status(node)
        return True

    def _finish_write_through_ack(self, ack_id: int) -> None:
        lock_node, published = self.ongoing_write_through.pop(ack_id)
        for n in published:  # finish_write_through (unified_tree_core.py:2840-2849)
            if n.pending_ack == ack_id:
                n.pending_ack = None
                self._update_duplicate_tracking(n)
        if not self.is_write_back:
            self.dec_lock_ref(lock_node)

    def writing_check(self, write_back: bool = False) -> None:
        """Process the write acks that are done (``writing_check``); ``write_back``: submit and wait for all
        (the blocking copy's time is the scheduler's: ``step_stall_s``)."""
        ctrl = self.hicache
        if write_back:
            ctrl.step_stall_s += ctrl.transfer_s(sum(n for _, n in ctrl.write_queue))
            ctrl.start_writing(self.now)
            ready = len(ctrl.ack_write_queue)
        else:
            ready = ctrl.ready_write_acks(self.now)
        for _ in range(ready):
            _, ids = ctrl.ack_write_queue.pop(0)
            for ack_id in ids:
                if ack_id in self.ongoing_write_through:
                    self._finish_write_through_ack(ack_id)

    def loading_check(self) -> None:
        ctrl = self.hicache
        for _ in range(ctrl.ready_load_acks(self.now)):
            _, ids, _ = ctrl.ack_load_queue.pop(0)
            for anchor_id in ids:
                anchor, lock, host_lock = self.ongoing_load_back.pop(anchor_id)
                self.dec_lock_ref(lock)
                self.dec_host_lock_ref(host_lock)
                self._finish_load_back(anchor)

    def check_hicache_events(self, now: float) -> None:
        """Each scheduler iteration, first (``check_hicache_events``, ``unified_radix_cache.py:3651-3707``): submit
        queued writes, then process the write and load acks that are done."""
        self.now = now
        self.hicache.start_writing(now)
        self.writing_check()
        self.loading_check()

    def flush_pending_backups(self, now: float) -> None:
        """After a batch's result is processed (``scheduler.py:5105-5106``)."""
        self.now = now
        self.hicache.start_writing(now)

    def ready_to_load_host_cache(self) -> int:
        return self.hicache.start_loading()

    # ------------------------------------------------------------------ device eviction
    def evict(self, num_tokens: int) -> int:
        """``_evict`` (``unified_radix_cache.py:805-839``): LRU device leaves until ``num_tokens`` device slots are
        free again; each is demoted, dropped or (write_back) written back and demoted."""
        if len(self._leaf_heap) > 4 * len(self.evictable_leaves) + 1024:
            self._leaf_heap = [(n.last_access_time, n.id, n) for n in self.evictable_leaves]
            heapq.heapify(self._leaf_heap)
        evicted = 0
        while evicted < num_tokens:
            node = self._pop_lru_leaf()
            if node is None:
                break
            evicted += self._evict_device_leaf(node)
        if self.is_write_back:
            self.writing_check(write_back=True)
        return evicted

    def _evict_device_leaf(self, node) -> int:
        if node.host_value is not None:
            return self._demote(node)
        if not self.is_write_back:
            return self._delete_unbacked_leaf(node)
        if self._backup(node):  # write_back: the deferred backup, then the demote (:1028-1033)
            self.writing_check(write_back=True)
            return self._demote(node)
        return self._drop_subtree_no_host(node)

    def _demote(self, node) -> int:
        n = len(node.value)
        self.token_to_kv_pool_allocator.free_segment(node.value, start_pos=0)
        self.evictable_size_ -= n
        self.num_evicted_tokens += n
        self.num_demoted_tokens += n
        node.value = None
        self.full_host_duplicates.pop(node.id, None)
        self.evictable_leaves.discard(node)
        self._update_leaf_status(node)
        self._update_leaf_status(node.parent)
        return n

    def _delete_unbacked_leaf(self, node) -> int:
        """``_delete_unbacked_device_leaf``; a host-only subtree below it (which SGLang's write-through never leaves
        there: backups go ancestors first) goes with it."""
        for child in list(node.children.values()):
            self._drop_host_subtree(child)
        n = self._delete_leaf(node)
        self.num_dropped_tokens += n
        return n

    def _drop_subtree_no_host(self, node) -> int:
        """``drop_subtree_no_host`` (``unified_tree_core.py:1825-1876``): declined when anything in it is locked."""
        stack = list(node.children.values())
        while stack:
            cur = stack.pop()
            if cur.lock_ref or cur.host_lock_ref or cur.pending_ack is not None or cur.load_back_pending is not None:
                return 0
            stack.extend(cur.children.values())
        return self._delete_unbacked_leaf(node)

    def _drop_host_subtree(self, node) -> None:
        for child in list(node.children.values()):
            self._drop_host_subtree(child)
        if node.host_value is not None:
            self.host_pool.free(node.host_value)
            self.num_host_evicted_tokens += len(node.host_value)
            node.host_value = None
        del node.parent.children[self._child_key_of(node)]
        self.evictable_host_leaves.discard(node)
        self.evictable_leaves.discard(node)

    # ------------------------------------------------------------------ host eviction
    def evict_host(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` host slots; returns host tokens freed (``evict_host``)."""
        freed = 0
        if self.is_write_back:
            freed = self._reclaim_full_host_duplicates(num_tokens)
        if len(self._host_heap) > 4 * len(self.evictable_host_leaves) + 1024:
            self._host_heap = [(n.last_access_time, n.id, n) for n in self.evictable_host_leaves]
            heapq.heapify(self._host_heap)
        heap = self._host_heap
        while freed < num_tokens and heap:
            t, node_id, node = heapq.heappop(heap)
            if node not in self.evictable_host_leaves:
                continue
            if node.last_access_time != t:
                heapq.heappush(heap, (node.last_access_time, node_id, node))
                continue
            freed += self._evict_host_leaf(node)
        return freed

    def _evict_host_leaf(self, node) -> int:
        n = len(node.host_value)
        self.host_pool.free(node.host_value)
        node.host_value = None
        self.num_host_evicted_tokens += n
        self.evictable_host_leaves.discard(node)
        parent = node.parent
        del parent.children[self._child_key_of(node)]
        self.full_host_duplicates.pop(node.id, None)
        self._update_leaf_status(parent)
        return n

    def _reclaim_full_host_duplicates(self, num_tokens: int) -> int:
        """write_back: free the host copies of nodes also on device, in registration order; pass 1 spares the
        evictable device leaves (about to be demoted), pass 2 takes them."""
        freed = 0
        swept = []
        for spare_leaves in (True, False):
            if freed >= num_tokens:
                break
            for node in self.full_host_duplicates.values():
                if freed >= num_tokens:
                    break
                if node.value is None or node.host_value is None:
                    swept.append(node.id)
                    continue
                if spare_leaves and node in self.evictable_leaves:
                    continue
                if node.pending_ack is not None or node.load_back_pending is not None or node.host_lock_ref:
                    continue
                freed += len(node.host_value)
                self.num_host_evicted_tokens += len(node.host_value)
                self.host_pool.free(node.host_value)
                node.host_value = None
                self._update_leaf_status(node)
                swept.append(node.id)
        for node_id in swept:
            self.full_host_duplicates.pop(node_id, None)
        return freed

    def _update_duplicate_tracking(self, node) -> None:
        if (node is not self.root_node and node.value is not None and node.host_value is not None
                and node.pending_ack is None and node.load_back_pending is None):
            self.full_host_duplicates.setdefault(node.id, node)
        else:
            self.full_host_duplicates.pop(node.id, None)

    def _delete_leaf(self, node) -> int:
        self.full_host_duplicates.pop(node.id, None)
        return super()._delete_leaf(node)

    # ------------------------------------------------------------------ load-back
    def init_load_back(self, req) -> int:
        """Load the request's host hit back to device (``init_load_back``): the tokens loaded (0: not loaded, to be
        recomputed); on success ``req.last_node`` becomes its best match node."""
        best = req.best_match_node
        if best is None or req.host_hit_length <= 0:
            return 0
        loaded = self.load_back(best)
        if not loaded:
            self.num_recomputed_host_tokens += req.host_hit_length
            return 0
        req.last_node = best
        return loaded

    def load_back(self, node) -> int:
        """``load_back`` + ``_load_back_transfers`` (``unified_radix_cache.py:1820-1937``); the tokens loaded."""
        host_lock = self.inc_host_lock_ref(node)
        self.inc_lock_ref(node)
        nodes = []
        cur = node
        while cur.value is None:
            nodes.append(cur)
            cur = cur.parent
        nodes.reverse()
        kv_tokens = sum(len(n.host_value) for n in nodes)
        if kv_tokens < max(1, self.load_back_threshold):
            self.dec_lock_ref(node)
            self.dec_host_lock_ref(host_lock)
            return 0
        alloc = self.token_to_kv_pool_allocator
        if alloc.available_size() < kv_tokens:
            self.evict_for_alloc(kv_tokens - alloc.available_size())
        device = alloc.alloc(kv_tokens) if alloc.available_size() >= kv_tokens else None
        self.dec_lock_ref(node)
        if device is None:
            self.dec_host_lock_ref(host_lock)
            return 0
        device = np.asarray(device, dtype=np.int64)
        offset = 0
        for n in nodes:  # commit_load_back (components/full.py:432-471)
            k = len(n.host_value)
            slots = device[offset: offset + k].copy()
            slots.flags.writeable = False
            n.value = slots
            offset += k
            if n.lock_ref > 0:
                self.protected_size_ += k
            else:
                self.evictable_size_ += k
            if self.is_write_back:
                n.load_back_pending = node.id
            self._update_leaf_status(n)
            self._update_leaf_status(n.parent)
        self._update_leaf_status(node)
        self.ongoing_load_back[node.id] = (node, self.lock(node), host_lock)
        self.hicache.load_queue.append((node.id, kv_tokens))
        self.num_load_back_tokens += kv_tokens
        return kv_tokens

    def _finish_load_back(self, anchor) -> None:
        node = anchor
        while node is not self.root_node:
            if self.is_write_back:
                if node.load_back_pending != anchor.id:
                    node = node.parent
                    continue
                node.load_back_pending = None
            self._update_duplicate_tracking(node)
            node = node.parent

    # ------------------------------------------------------------------ integrity
    def check_integrity(self) -> None:
        """Device ledgers and leaf sets, host slots held == host pool's used slots, no node without a copy, device
        nodes only under device nodes, every pending copy acknowledged to an ongoing write."""
        evictable = protected = host_held = 0
        device_leaves, host_leaves = set(), set()
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            if node.value is None and node.host_value is None:
                raise PoolError(f"node {node.id}: neither a device nor a host copy")
            for copy in (node.value, node.host_value):
                if copy is not None and len(copy) != len(node.key):
                    raise PoolError(f"node {node.id}: key/copy lengths {len(node.key)}/{len(copy)}")
            if len(node.key) % self.page_size:
                raise PoolError(f"node {node.id}: key length {len(node.key)} not page-aligned")
            if node.value is not None:
                if node.parent is not self.root_node and node.parent.value is None:
                    raise PoolError(f"node {node.id} is on device under a host-only parent {node.parent.id}")
                if node.lock_ref:
                    protected += len(node.value)
                else:
                    evictable += len(node.value)
            if node.lock_ref < 0 or node.host_lock_ref < 0:
                raise PoolError(f"node {node.id}: negative lock")
            if node.host_value is not None:
                host_held += len(node.host_value)
            if node.pending_ack is not None and node.pending_ack not in self.ongoing_write_through:
                raise PoolError(f"node {node.id}: pending write {node.pending_ack} with no ongoing write")
            if self._is_leaf(node):
                device_leaves.add(node)
            if self._is_host_leaf(node):
                host_leaves.add(node)
            stack.extend(node.children.values())
        if (evictable, protected) != (self.evictable_size_, self.protected_size_):
            raise PoolError(f"evictable/protected {self.evictable_size_}/{self.protected_size_} "
                            f"but the tree holds {evictable}/{protected}")
        if device_leaves != self.evictable_leaves:
            raise PoolError("evictable device leaf set disagrees with the tree")
        if host_leaves != self.evictable_host_leaves:
            raise PoolError("evictable host leaf set disagrees with the tree")
        self.host_pool.check_integrity(host_held)
