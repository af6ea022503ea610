"""The radix prefix cache: SGLang 0.5.23's ``UnifiedRadixCache`` with its FULL component.

Semantics (docs/sglang.md sections 4 and 5, checked against ``unified_cache/unified_tree_core.py``):
- keys are page-aligned before every match and insert; the unaligned tail never enters the tree;
- a match or insert that ends inside a node splits it; the new parent copies the child's lock;
- recency is a logical clock: a node gets ``t = counter++`` when created, touched by an insert walk
  or split off; a match stamps ``counter++`` on the deepest matched node and ``t - 1e-5 * k`` on its
  k-th ancestor, so a parent is always older than the child it was reached through;
- ``insert`` frees the caller's duplicate slots itself, per overlapped node, from
  ``prev_prefix_len`` (the request's ``cache_protected_len``) on;
- eviction pops unlocked leaves by LRU, frees whole nodes (it may overshoot) and makes a parent
  a candidate once it has no children left.

Keys are numpy int64 token arrays and node keys/values are numpy slices: a match walks one dict
lookup per node and compares each node's tokens in one vectorised call, never token by token.
"""

from __future__ import annotations

import heapq
from typing import Any, NamedTuple

import numpy as np
from mypy_extensions import mypyc_attr

from poolsim.pools.backend.numpy_backend import NUMPY_BACKEND
from poolsim.pools.errors import PoolError
from poolsim.pools.mem_cache.base_prefix_cache import BasePrefixCache
from poolsim.pools.mem_cache.req_kv import ReqKvInfo

_EMPTY = np.empty(0, dtype=np.int64)
_BYTES_COMPARE_MAX = 8192  # tokens; see _match_len


class RadixKey:
    """Token ids (int64 array) in a namespace: keys with different ``extra_key`` never share nodes."""

    __slots__ = ("token_ids", "extra_key")

    def __init__(self, token_ids, extra_key: str | None = None):
        self.token_ids = np.asarray(token_ids, dtype=np.int64)
        self.extra_key = extra_key

    def __len__(self) -> int:
        return len(self.token_ids)

    def page_aligned(self, page_size: int) -> "RadixKey":
        n = len(self.token_ids) // page_size * page_size
        return self if n == len(self.token_ids) else RadixKey(self.token_ids[:n], self.extra_key)


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed in swa_* (not compiled)
class TreeNode:
    __slots__ = ("id", "children", "parent", "key", "value", "extra_key", "lock_ref", "last_access_time",
                 "mamba_value", "mamba_lock_ref", "mamba_lru_stamp")

    def __init__(self, node_id: int, key: np.ndarray, value: np.ndarray, parent: "TreeNode | None",
                 extra_key: str | None = None):
        self.id = node_id
        self.extra_key = extra_key
        self.children: dict = {}
        self.parent = parent
        self.key = key
        self.value = value  # KV slot per token (the root's is empty)
        self.lock_ref = 0
        self.last_access_time = 0.0
        self.mamba_value: int | None = None  # state slot holding the state after this node's last token
        self.mamba_lock_ref = 0
        self.mamba_lru_stamp = 0  # the mamba tree's LRU position: larger = more recently used

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, len={len(self.key)}, lock={self.lock_ref}, t={self.last_access_time})"


class MatchResult(NamedTuple):
    slot_chunks: tuple  # the matched nodes' slot arrays, root first (joined only when asked for)
    prefix_len: int  # SGLang's device_prefix_len
    last_node: TreeNode  # deepest usable matched node
    full_kv_hit_length: int = 0  # FULL match length (exceeds prefix_len when mamba states are missing)
    mamba_branching_seqlen: int | None = None
    swa_branching_seqlen: int | None = None  # SWA trees: page-aligned end of a full-KV hit past the valid prefix

    @property
    def device_indices(self) -> np.ndarray:
        """KV slots of the matched prefix."""
        return np.concatenate(self.slot_chunks) if self.slot_chunks else _EMPTY


class InsertResult(NamedTuple):
    prefix_len: int  # tokens already in the tree
    last_node: TreeNode
    mamba_exist: bool = False


@mypyc_attr(allow_interpreted_subclasses=True)  # subclassed in swa_* (not compiled)
class RadixCache(BasePrefixCache):
    """The tree cache the scheduler talks to (SGLang's ``UnifiedRadixCache``, FULL component only)."""

    def __init__(self, req_to_token_pool, token_to_kv_pool_allocator, page_size: int | None = None):
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size)
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        self._clock = 0.0
        self._next_id = 0
        self.root_node = self._new_node(_EMPTY, _EMPTY, None)
        self.root_node.lock_ref = 1
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self.num_evicted_tokens = 0  # running total, for metrics
        self.num_mamba_evicted_tokens = 0
        self.evictable_leaves: set[TreeNode] = set()
        self._leaf_heap: list = []  # (last_access_time, id, node), possibly older than the node; see _pop_lru_leaf

    def _tick(self) -> float:
        t = self._clock
        self._clock += 1.0
        return t

    def _new_node(self, key, value, parent, extra_key=None) -> TreeNode:
        node = TreeNode(self._next_id, key, value, parent, extra_key)
        self._next_id += 1
        node.last_access_time = self._tick()
        self._tick()  # creation_time: SGLang stamps it from the same counter
        return node

    def _touch(self, node: TreeNode, t: float) -> None:
        # The leaf heap only needs an entry no later than each leaf's time (``_pop_lru_leaf`` requeues an
        # outdated one), so a newer stamp, the usual case, pushes nothing.
        if t < node.last_access_time and node in self.evictable_leaves:
            heapq.heappush(self._leaf_heap, (t, node.id, node))
        node.last_access_time = t

    def evictable_size(self) -> int:
        return self.evictable_size_

    def full_evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    def total_size(self) -> int:
        return self.evictable_size_ + self.protected_size_

    def supports_prefix_sharing(self) -> bool:
        return True

    # ------------------------------------------------------------------ keys
    def _child_key(self, tokens: np.ndarray, extra_key):
        first = int(tokens[0]) if self.page_size == 1 else tokens[: self.page_size].tobytes()
        return first if extra_key is None else (extra_key, first)

    def _match_len(self, node_key: np.ndarray, tokens: np.ndarray) -> int:
        n = min(len(node_key), len(tokens))
        a, b = node_key[:n], tokens[:n]
        # The common case is a whole match: one memcmp of two byte copies beats a vectorised compare on
        # short keys, but copies past ~128 KiB are fresh mmaps that page-fault, so long keys compare in place.
        if a.tobytes() == b.tobytes() if n <= _BYTES_COMPARE_MAX else (a == b).all():
            return n // self.page_size * self.page_size
        diff = np.flatnonzero(a != b)
        m = int(diff[0]) if diff.size else n
        return m // self.page_size * self.page_size

    # ------------------------------------------------------------------ match
    def match_prefix(self, key: RadixKey, **kwargs) -> MatchResult:
        """Longest cached page-aligned prefix of ``key``. Splits a node where the match ends inside
        it and refreshes recency along the path; locks nothing."""
        key = key.page_aligned(self.page_size)
        if len(key) == 0:
            return self._empty_match()
        path, _, _ = self._walk(key.token_ids, key.extra_key)
        return self._finish_path(key, path, **kwargs)

    def _walk(self, tokens: np.ndarray, extra) -> tuple[list, list, int]:
        """Follow ``tokens`` down from the root, splitting the node where the match ends inside it.
        Returns the matched nodes (each matched whole once split), their child keys, and the number of
        tokens they cover."""
        node, pos = self.root_node, 0
        path, child_keys = [], []
        while pos < len(tokens):
            ck = self._child_key(tokens[pos:], extra)
            child = node.children.get(ck)
            if child is None:
                break
            plen = self._match_len(child.key, tokens[pos:])
            split = plen < len(child.key)
            if split:
                child = self._split_node(child, plen)
            path.append(child)
            child_keys.append(ck)
            node = child
            pos += plen
            if split:
                break
        return path, child_keys, pos

    def _finish_path(self, key, path: list, **kwargs) -> MatchResult:
        """The match result of a walked path: it ends on the deepest node ``_match_valid`` accepts."""
        best_values = self._best_on_path(path)
        best = path[best_values - 1] if best_values else self.root_node
        full_hit = sum(len(node.key) for node in path)
        return self._finish_match(key, [node.value for node in path], best, best_values, full_hit, **kwargs)

    def _best_on_path(self, path: list) -> int:
        """How many nodes of ``path`` the match keeps: up to the deepest one ``_match_valid`` accepts."""
        self._begin_match()
        best = 0
        for i, node in enumerate(path, 1):
            if self._match_valid(node):
                best = i
        return best

    def touch_prefix(self, make_key, hint=None):
        """``match_prefix(make_key())`` for its effect on the tree alone (splits, recency stamps), as the
        waiting-queue refresh uses it; returns a hint for the next call with the same key.

        The hint holds the walked path, each node's child key and the key of the lookup that ended the
        walk. While every path node is still its parent's child under the same key (a split or a deletion
        replaces or removes that entry; node keys change only in a split) and that last lookup still
        misses, a fresh walk would compare the same tokens against the same nodes and find the same
        path, so only its ``_finish_path`` (validity checks and stamps) is replayed, without building the
        key or comparing a token."""
        if hint is not None:
            path, child_keys, end_key = hint
            node = self.root_node
            for ck, child in zip(child_keys, path):
                if node.children.get(ck) is not child:
                    break
                node = child
            else:
                if end_key is None or end_key not in node.children:
                    self._touch_path(path)
                    return hint
        key = make_key().page_aligned(self.page_size)
        if len(key) == 0:
            return None  # match_prefix touches nothing for an empty key
        tokens, extra = key.token_ids, key.extra_key
        path, child_keys, pos = self._walk(tokens, extra)
        self._touch_path(path)
        # A walk that stopped at a split would miss on its next lookup (the split is on the first
        # unequal page), so the lookup below the path is the one to watch either way.
        end_key = self._child_key(tokens[pos:], extra) if pos < len(tokens) else None
        return path, child_keys, end_key

    def touch_prefix_reference(self, make_key, hint=None) -> None:
        """``touch_prefix`` as SGLang does it: a whole ``match_prefix`` from the root on every call (no hint to
        carry: it returns None). tests/pools/test_fast_paths.py checks that the two leave the same tree."""
        self.match_prefix(make_key())

    def _touch_path(self, path: list) -> None:
        """``_finish_path``'s effect on the tree without building the result nobody reads."""
        best = self._best_on_path(path)
        self._touch_match(path[best - 1] if best else self.root_node)

    def _begin_match(self) -> None:
        """Hook: reset ``_match_valid``'s state before a path is checked (the SWA tree counts a window)."""

    def _match_valid(self, node: TreeNode) -> bool:
        return True

    def _touch_match(self, best: TreeNode) -> None:
        """What a match changes besides splits: recency along the path to the node it ends on."""
        t = self._tick()
        node: TreeNode | None = best
        while node is not None:
            self._touch(node, t)
            t -= 1e-5
            node = node.parent

    def _finish_match(self, key, values, best, best_values, full_hit, **kwargs) -> MatchResult:
        self._touch_match(best)
        matched = tuple(values[:best_values])
        return MatchResult(matched, sum(map(len, matched)), best, full_hit)

    def _empty_match(self) -> MatchResult:
        return MatchResult((), 0, self.root_node, 0)

    def path_device_indices(self, node: TreeNode) -> np.ndarray:
        chunks = []
        while node is not self.root_node:
            chunks.append(node.value)
            node = node.parent  # type: ignore[assignment]  # below the root a parent is set
        return np.concatenate(chunks[::-1]) if chunks else _EMPTY

    def _path_tail(self, node: TreeNode, start: int) -> tuple[int, np.ndarray]:
        """(length of the path to ``node``, its slots from position ``start`` on), without concatenating
        the part before ``start`` that the caller's row already holds."""
        chunks = []
        while node is not self.root_node:
            chunks.append(node.value)
            node = node.parent  # type: ignore[assignment]  # below the root a parent is set
        total = sum(map(len, chunks))
        tail, covered = [], total
        for chunk in chunks:
            if covered <= start:
                break
            covered -= len(chunk)
            tail.append(chunk[max(start - covered, 0):])
        if len(tail) == 1:
            return total, tail[0]  # a node's own slots: the caller copies them into its row
        return total, np.concatenate(tail[::-1]) if tail else _EMPTY

    # ------------------------------------------------------------------ insert
    def insert(self, key: RadixKey, value, prev_prefix_len: int = 0, mamba_value: int | None = None,
               from_node: TreeNode | None = None) -> InsertResult:
        """Insert ``key -> value`` (page-aligned). Existing nodes keep their own slots; the caller's
        duplicates in ``[prev_prefix_len, already-cached length)`` are freed here, node by node.

        ``from_node``: a node whose root path holds exactly ``key[:prev_prefix_len]`` (the node a request's
        previous checkpoint locked). The walk down to it matches every node whole and frees nothing, so
        only its recency stamps are replayed and the token compare resumes below it. ``from_node=None`` is
        the reference, SGLang's walk from the root (tests/pools/test_fast_paths.py checks that both agree)."""
        key = key.page_aligned(self.page_size)
        if not isinstance(value, np.ndarray):
            value = np.asarray(value, dtype=np.int64)
        # A numpy view of any int dtype (a request's int32 row) is not converted as a whole: the slots
        # freed are converted by the allocator and a new node's are copied to int64 below.
        value = value[: len(key)]
        self._touch(self.root_node, self._tick())
        if len(key) == 0:
            return InsertResult(0, self.root_node, mamba_exist=True)
        tokens, extra = key.token_ids, key.extra_key
        alloc = self.token_to_kv_pool_allocator
        node, pos = self.root_node, 0
        path = self._path_to(from_node) if from_node is not None and 0 < prev_prefix_len <= len(tokens) else None
        if path is not None and sum(len(n.key) for n in path) == prev_prefix_len:
            for n in path:
                self._touch(n, self._tick())
            node, pos = from_node, prev_prefix_len  # type: ignore[assignment]  # from_node is set here
        while pos < len(tokens):
            child = node.children.get(self._child_key(tokens[pos:], extra))
            if child is None:
                break
            self._touch(child, self._tick())
            plen = self._match_len(child.key, tokens[pos:])
            if plen < len(child.key):
                child = self._split_node(child, plen)
            dup_start = max(0, prev_prefix_len - pos)
            if dup_start < plen:
                alloc.free_segment(value[pos + dup_start: pos + plen], start_pos=0)
            node = child
            pos += plen
        if pos < len(tokens):
            slots = np.array(value[pos:], dtype=np.int64)
            slots.flags.writeable = False  # a node's slots never change: freed, the free list keeps them uncopied
            target = self._add_new_node(node, NUMPY_BACKEND.keep(tokens[pos:]), slots, extra)
            is_new_leaf = True
        else:
            target, is_new_leaf = node, False
        mamba_exist = self._commit_insert(target, is_new_leaf, mamba_value)
        return InsertResult(pos, target, mamba_exist)

    def _path_to(self, node: TreeNode) -> list[TreeNode]:
        """The nodes from the root's child down to ``node``."""
        path = []
        while node is not self.root_node:
            path.append(node)
            node = node.parent  # type: ignore[assignment]  # below the root a parent is set
        return path[::-1]

    def _commit_insert(self, node: TreeNode, is_new_leaf: bool, mamba_value: int | None) -> bool:
        return False

    def _add_new_node(self, parent: TreeNode, key: np.ndarray, value: np.ndarray, extra) -> TreeNode:
        node = self._new_node(key, value, parent, extra)
        parent.children[self._child_key(key, extra)] = node
        self.evictable_size_ += len(value)
        self._update_leaf_status(node)
        self._update_leaf_status(parent)
        return node

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut ``child`` after ``split_len`` tokens; the new parent takes the prefix and child's locks."""
        parent = child.parent
        extra = child.extra_key
        new = self._new_node(child.key[:split_len], child.value[:split_len], parent, extra)
        new.lock_ref = child.lock_ref
        child.key = child.key[split_len:]
        child.value = child.value[split_len:]
        child.parent = new
        new.children[self._child_key(child.key, extra)] = child
        assert parent is not None  # the root is never split
        parent.children[self._child_key(new.key, extra)] = new
        self._touch(child, self._tick())
        self._update_leaf_status(new)
        self._update_leaf_status(child)
        return new

    # ------------------------------------------------------------------ locks
    def inc_lock_ref(self, node: TreeNode) -> int:
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.value)
                self.protected_size_ += len(node.value)
                delta += len(node.value)
            node.lock_ref += 1
            self.evictable_leaves.discard(node)
            node = node.parent  # type: ignore[assignment]  # below the root a parent is set
        return delta

    def dec_lock_ref(self, node: TreeNode) -> int:
        delta = 0
        while node is not self.root_node:
            if node.lock_ref <= 0:
                raise PoolError(f"unlock of node {node.id} whose lock_ref is already 0")
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.value)
                self.protected_size_ -= len(node.value)
                delta += len(node.value)
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._update_leaf_status(node)
            node = node.parent  # type: ignore[assignment]  # below the root a parent is set
        return delta

    def lock(self, node: TreeNode) -> Any:  # the SWA tree's lock is a (node, window node) pair
        self.inc_lock_ref(node)
        return node

    def unlock(self, lock: Any) -> None:
        if lock is not None:
            self.dec_lock_ref(lock)

    # ------------------------------------------------------------------ eviction
    def _is_leaf(self, node: TreeNode) -> bool:
        return (node is not self.root_node and node.lock_ref == 0 and node.mamba_lock_ref == 0
                and not node.children)

    def _update_leaf_status(self, node: TreeNode) -> None:
        if self._is_leaf(node):
            if node not in self.evictable_leaves:
                self.evictable_leaves.add(node)
                heapq.heappush(self._leaf_heap, (node.last_access_time, node.id, node))
        else:
            self.evictable_leaves.discard(node)

    def _pop_lru_leaf(self) -> TreeNode | None:
        """The evictable leaf with the least (time, id). Every evictable leaf has a heap entry no later than
        its own (time, id), so an entry that pops with its node's current time is the least of all; one
        whose node was touched since goes back at the node's time."""
        heap = self._leaf_heap
        while heap:
            t, node_id, node = heapq.heappop(heap)
            if node in self.evictable_leaves:
                if node.last_access_time == t:
                    return node
                heapq.heappush(heap, (node.last_access_time, node_id, node))
        return None

    def evict(self, num_tokens: int) -> int:
        """Evict unlocked leaves in LRU order until ``num_tokens`` are freed; returns tokens evicted."""
        if len(self._leaf_heap) > 4 * len(self.evictable_leaves) + 1024:
            self._leaf_heap = [(n.last_access_time, n.id, n) for n in self.evictable_leaves]
            heapq.heapify(self._leaf_heap)
        evicted = 0
        while evicted < num_tokens:
            node = self._pop_lru_leaf()
            if node is None:
                break
            evicted += self._delete_leaf(node)
        return evicted

    def evict_for_alloc(self, num_tokens: int) -> int:
        return self.evict(num_tokens)

    def _delete_leaf(self, node: TreeNode) -> int:
        """Free a leaf's KV (and state), detach it, and let its parent become a candidate."""
        n = len(node.value)
        self.token_to_kv_pool_allocator.free_segment(node.value, start_pos=0)
        self.evictable_size_ -= n
        self.num_evicted_tokens += n
        self._release_mamba(node)
        parent = node.parent
        assert parent is not None  # a leaf is never the root
        del parent.children[self._child_key_of(node)]
        self.evictable_leaves.discard(node)
        self._update_leaf_status(parent)
        return n

    def _child_key_of(self, node: TreeNode):
        return self._child_key(node.key, node.extra_key)

    def _release_mamba(self, node: TreeNode) -> None:
        """Hook: the mamba tree frees the node's state slot with its KV."""

    # ------------------------------------------------------------------ request lifecycle
    def checkpoint(self, req, up_to: int) -> None:
        """Insert the request's ``[0, up_to)`` tokens, re-anchor its row on the tree's slots and move
        its lock to the node the insert ended on (``checkpoint_into_tree``)."""
        is_finished = req.finished()
        kv: ReqKvInfo = req.kv
        row = self.req_to_token_pool.req_to_token[kv.req_pool_idx]
        cache_len, mamba_value, keep_idx = self._prepare_for_caching(req, up_to, is_finished)
        if cache_len <= 0:
            self._cleanup_after_caching(req, is_finished, None, mamba_value, keep_idx)
            return
        key = RadixKey(req.token_ids(cache_len), req.extra_key).page_aligned(self.page_size)
        aligned = len(key)
        values = row[:aligned]  # a view of the int32 row: insert converts only the slots it keeps or frees
        result = self.insert(key, values, prev_prefix_len=kv.cache_protected_len, mamba_value=mamba_value,
                             from_node=req.last_node if req.lock is req.last_node else None)
        kv.cache_inserted_len = max(kv.cache_inserted_len, aligned)
        self._split_prompt(req, key, result.last_node)
        new_len, new_tail = self._path_tail(result.last_node, kv.cache_protected_len)
        self.req_to_token_pool.write((kv.req_pool_idx, slice(kv.cache_protected_len, new_len)), new_tail)
        self.unlock(req.lock)
        req.lock = self.lock(result.last_node)
        kv.cache_protected_len = new_len
        req.last_node = result.last_node
        self._cleanup_after_caching(req, is_finished, result, mamba_value, keep_idx)

    def _split_prompt(self, req, key: RadixKey, last_node: TreeNode) -> None:
        """Re-insert the page-aligned prompt so the leaf splits at the prompt/output boundary and
        eviction can drop the output KV first (FULL-only trees). ``last_node`` ends the path that
        spells ``key``, just inserted."""
        prompt_len = req.origin_input_len // self.page_size * self.page_size
        if 0 < prompt_len < len(key):
            self._reinsert_prefix(last_node, prompt_len)

    def _reinsert_prefix(self, node: TreeNode, length: int) -> None:
        """``insert`` of the first ``length`` (page-aligned) tokens of ``node``'s root path with
        ``prev_prefix_len=length``. That walk follows this very path (the key is a prefix of it, so
        every compare matches a whole node or runs out of key) and frees nothing: the same stamps and
        split, without looking up or comparing a token."""
        self._touch(self.root_node, self._tick())
        pos, last = 0, self.root_node
        for child in self._path_to(node):
            if pos >= length:
                break
            self._touch(child, self._tick())
            plen = min(len(child.key), length - pos)
            if plen < len(child.key):
                child = self._split_node(child, plen)
            last = child
            pos += plen
        self._commit_insert(last, False, None)

    def _reinsert_prefix_reference(self, node: TreeNode, length: int) -> None:
        """``_reinsert_prefix`` as SGLang does it: the prompt key inserted again from the root, its slots the
        tree's own, ``prev_prefix_len=length`` (tests/pools/test_fast_paths.py checks that both agree)."""
        tokens = np.concatenate([n.key for n in self._path_to(node)])
        self.insert(RadixKey(tokens[:length], node.extra_key), self.path_device_indices(node)[:length],
                    prev_prefix_len=length)

    def _prepare_for_caching(self, req, up_to: int, is_finished: bool) -> tuple[int, int | None, int | None]:
        """Hook: (length to insert, state slot offered to the tree, ping-pong position it came from)."""
        return up_to, None, None

    def _cleanup_after_caching(self, req, is_finished: bool, result, mamba_value, keep_idx) -> None:
        """Hook: the mamba tree hands over or frees state slots here."""

    # ------------------------------------------------------------------ integrity
    def check_integrity(self) -> None:
        """Sizes and leaf set agree with a full walk of the tree."""
        evictable = protected = 0
        stack = list(self.root_node.children.values())
        leaves = set()
        while stack:
            node = stack.pop()
            if node.lock_ref < 0 or (node.lock_ref > 0 and node.parent is not self.root_node
                                     and node.parent.lock_ref < node.lock_ref):
                raise PoolError(f"node {node.id}: lock_ref {node.lock_ref} exceeds its parent's")
            if len(node.key) != len(node.value) or len(node.key) % self.page_size:
                raise PoolError(f"node {node.id}: key/value lengths {len(node.key)}/{len(node.value)}")
            if node.lock_ref:
                protected += len(node.value)
            else:
                evictable += len(node.value)
            if self._is_leaf(node):
                leaves.add(node)
            stack.extend(node.children.values())
        if (evictable, protected) != (self.evictable_size_, self.protected_size_):
            raise PoolError(f"evictable/protected {self.evictable_size_}/{self.protected_size_} "
                            f"but the tree holds {evictable}/{protected}")
        if leaves != self.evictable_leaves:
            raise PoolError("evictable leaf set disagrees with the tree")
