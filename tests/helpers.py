"""Small helpers shared by the tests."""


def as_list(x):
    """Index arrays of either backend (numpy array, torch tensor, list) as a list of ints."""
    if x is None:
        return None
    if hasattr(x, "tolist"):
        return [int(v) for v in x.tolist()]
    return [int(v) for v in x]


class FakeReq:
    """A minimal request for driving the pools directly (the ``pools.mem_cache.req_kv.ReqLike`` protocol)."""

    def __init__(self, tokens, extra_key=None, origin_input_len=None):
        import numpy as np

        from poolsim.pools.mem_cache.req_kv import ReqKvInfo

        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.origin_input_len = len(self.tokens) if origin_input_len is None else origin_input_len
        self.extra_key = extra_key
        self.kv = ReqKvInfo()
        self.lock = None
        self.last_node = None
        self.prefix_len = 0
        self.extend_end = 0
        self.mamba_branching_seqlen = None
        self.swa_branching_seqlen = None
        self.done = False

    @property
    def seqlen(self):
        return len(self.tokens)

    def token_ids(self, n):
        return self.tokens[:n]

    def finished(self):
        return self.done

    def owned_kv_len(self):
        return self.kv.kv_committed_len


def owned_slots(reqs, pool, page_size):
    """KV slots the live requests own outside the tree (whole pages)."""
    import numpy as np

    total = 0
    for r in reqs:
        if r.kv.req_pool_idx is None:
            continue
        row = np.asarray(pool.req_to_token[r.kv.req_pool_idx, r.kv.cache_protected_len: r.kv.kv_allocated_len])
        total += len(np.unique(row // page_size)) * page_size
    return total


def assert_conserved(tree, reqs, size):
    """available + evictable + protected + request-owned == size, and the tree agrees with itself."""
    alloc = tree.token_to_kv_pool_allocator
    owned = owned_slots(reqs, tree.req_to_token_pool, alloc.page_size)
    got = alloc.available_size() + tree.evictable_size() + tree.protected_size() + owned
    assert got == size, (alloc.available_size(), tree.evictable_size(), tree.protected_size(), owned)
    tree.check_integrity()
    alloc.check_integrity()


def tree_state(tree, reqs=()) -> dict:
    """Everything a later operation can read of a tree and its pools (two trees driven alike compare equal):
    nodes with their child order, stamps, clock, sizes, leaf set and heap, free lists, the request-row table and
    the handles of ``reqs``."""
    import numpy as np

    nodes, stack = [], [tree.root_node]
    while stack:
        n = stack.pop()
        row = (n.id, n.parent.id if n.parent is not None else -1, [c.id for c in n.children.values()],
               as_list(n.key), as_list(n.value), n.lock_ref, n.last_access_time, n.mamba_value, n.mamba_lock_ref,
               n.mamba_lru_stamp)
        if tree.supports_swa():
            row += (as_list(n.swa_value), n.swa_lock_ref, n.swa_uuid)
        nodes.append(row)
        stack.extend(n.children.values())
    alloc = tree.token_to_kv_pool_allocator
    state = {
        "nodes": sorted(nodes), "clock": tree._clock, "next_id": tree._next_id,
        "sizes": (tree.evictable_size(), tree.protected_size(), tree.num_evicted_tokens),
        "leaves": sorted(n.id for n in tree.evictable_leaves), "heap": sorted((t, i) for t, i, _ in tree._leaf_heap),
        "table": as_list(np.asarray(tree.req_to_token_pool.req_to_token).reshape(-1)),
        "free_rows": list(tree.req_to_token_pool.free_slots),
        "reqs": [(r.prefix_len, r.extend_end, r.kv.req_pool_idx, r.kv.kv_allocated_len, r.kv.kv_committed_len,
                  r.kv.cache_protected_len, r.kv.mamba_pool_idx, r.last_node.id if r.last_node else None)
                 for r in reqs],
    }
    if tree.supports_swa():
        state["free"] = (as_list(alloc.full_attn_allocator.free_pages), as_list(alloc.swa_attn_allocator.free_pages),
                         as_list(alloc.full_to_swa_index_mapping))
        state["swa"] = ([n.id for n in tree.swa_lru.lru_to_mru()], tree.swa_evictable_size(),
                        tree.swa_protected_size())
    else:
        state["free"] = as_list(alloc.free_pages)
    if tree.supports_mamba():
        state["mamba"] = (list(tree.mamba_lru), as_list(tree.mamba_allocator.free_slots),
                          tree.mamba_evictable_size(), tree.mamba_protected_size())
    return state


class TraceReq:
    """A trace record with explicit prompt tokens (the ``traces.Request`` interface the simulator reads)."""

    def __init__(self, rid, arrival_s, prompt, output_len, max_new_tokens=None, namespace=None):
        import numpy as np

        self.rid = rid
        self.arrival_s = arrival_s
        self._prompt = np.asarray(prompt, dtype=np.int64)
        self.input_len = len(self._prompt)
        self.output_len = output_len
        self.max_new_tokens = max_new_tokens
        self.ignore_eos = False
        self.namespace = namespace

    def prompt_tokens(self):
        return self._prompt

    def output_tokens(self, n):
        import numpy as np

        return -(self.rid * 1_000_000 + np.arange(1, n + 1, dtype=np.int64))

    def tokens_with_output(self, n):
        import numpy as np

        return np.concatenate([self._prompt, self.output_tokens(n)])


def run_sim(trace, config, step=0.01, mamba=None, disable_radix_cache=False, check=True, device=None,
            ignore_eos=False, swa=None, hicache=None):
    """Run the scheduler on a list of TraceReq with a fixed step time; returns (steps df, requests df, scheduler).
    ``ignore_eos``: every request is sent with ignore_eos (as bench_serving does)."""
    from poolsim.sim.engine import Simulation
    from poolsim.sim.metrics import Recorder
    from poolsim.sim.server import build_server
    from poolsim.sim.step_time import FixedStepTime

    from poolsim.sim.metrics import HOST_STEP_COLUMNS

    rec = Recorder(extra_step_columns=HOST_STEP_COLUMNS if hicache is not None else ())
    sched = build_server(config, mamba=mamba, disable_radix_cache=disable_radix_cache, recorder=rec, device=device,
                         swa=swa, hicache=hicache)
    sim = Simulation([sched], FixedStepTime(step), rec,
                     max_new_tokens_for=lambda t: (t.max_new_tokens or t.output_len, ignore_eos),
                     check_every_step=check)
    sim.run(trace)
    return rec.step_frame(), rec.request_frame(), sched


def small_trace(tmp_path, seconds: float = 20.0):
    """The bundled trace's first ``seconds``, written to a file for the CLI."""
    from poolsim.traces import DEFAULT_TRACE, load_trace, slice_trace, write_trace

    path = tmp_path / "small.jsonl"
    write_trace(slice_trace(load_trace(DEFAULT_TRACE), 0, seconds), path)
    return path
