"""Device replay: the simulation's own steps, with the servers' pools on a torch device and a step-time hook that
checks the pools, runs the stand-in forward over them and measures it, then returns the model's time so the
schedule is exactly the simulation's (the replay measures, it does not steer).

    app.run.simulate(..., replay=ReferenceRun())      numpy pools: one digest of the pools per step
    app.run.simulate(..., replay=DeviceReplay(...))   torch pools on the device: the same digests, checked per
                                                      step (first mismatch stops the run naming step and pool),
                                                      write_req_to_token's output against the simulator's rows,
                                                      the stand-in forward timed, outputs finite

Decode batches go through ``CudaGraphRunner`` as SGLang's decode runner takes them: padded to the next captured
batch size, replayed from CUDA graphs on a GPU (the padded batch runs eager on a CPU), eager above the largest.
"""

from __future__ import annotations

import bisect
import dataclasses
import time

import numpy as np

INTERPRETER_MAX_CONTEXT = 2048  # context tokens a decode step may read to run under TRITON_INTERPRET on a CPU
STEP_FIELDS = ("step", "kind", "batch_size", "graph_bs", "extend_tokens", "decode_tokens", "context_tokens",
               "predicted_s", "measured_s", "forward_s")  # graph_bs: the padded CUDA-graph size, 0 when eager


class PoolMismatch(RuntimeError):
    """The device pools and the simulator's disagree: the step and the pool are named."""

    def __init__(self, step: int, pool: str, detail: str = ""):
        super().__init__(step, pool, detail)  # the plain args: SimPy re-raises a process's error as type(e)(*e.args)
        self.step, self.pool, self.detail = step, pool, detail

    def __str__(self) -> str:
        return (f"step {self.step}: {self.pool} differs between the device pools and the simulation"
                + (f" ({self.detail})" if self.detail else ""))


class StepShape:
    """What the step-time model reads of a batch, kept per step so a fit can re-predict it."""

    __slots__ = ("forward_mode", "prefix_lens", "extend_lens", "decode_seq_lens", "decode_seq_lens_sum",
                 "num_decode_reqs", "reqs")

    def __init__(self, forward_mode, prefix_lens, extend_lens, decode_seq_lens, num_reqs):
        self.forward_mode = forward_mode
        self.prefix_lens, self.extend_lens, self.decode_seq_lens = prefix_lens, extend_lens, decode_seq_lens
        self.decode_seq_lens_sum, self.num_decode_reqs = sum(decode_seq_lens), len(decode_seq_lens)
        self.reqs = range(num_reqs)  # the model only counts them

    @staticmethod
    def of(batch) -> "StepShape":
        """Called at launch, like the step-time model (the decode rows' lengths are then this step's)."""
        return StepShape(batch.forward_mode, list(batch.prefix_lens), list(batch.extend_lens),
                         launch_seq_lens(batch), len(batch.reqs))

    @property
    def kind(self) -> str:
        return {"extend": "prefill"}.get(self.forward_mode, self.forward_mode)

    def to_dict(self) -> dict:
        return {"forward_mode": self.forward_mode, "prefix_lens": self.prefix_lens, "extend_lens": self.extend_lens,
                "decode_seq_lens": self.decode_seq_lens, "num_reqs": len(self.reqs)}


def _checksum(*arrays) -> str:
    """Per array: length, sum and position-weighted sum of the ids. Order-sensitive, computed where the array lives
    (two scalars cross from a GPU, not the list); int64 wraps the same way in numpy and torch on huge pools."""
    parts = []
    for a in arrays:
        if hasattr(a, "detach"):
            import torch

            x = a.reshape(-1).to(torch.int64)
            pos = torch.arange(1, x.numel() + 1, device=x.device, dtype=torch.int64)
            parts.append(f"{x.numel()}:{int(x.sum())}:{int((x * pos).sum())}")
        else:
            x = np.asarray(a, dtype=np.int64).reshape(-1)
            pos = np.arange(1, x.size + 1, dtype=np.int64)
            parts.append(f"{x.size}:{int(x.sum())}:{int((x * pos).sum())}")
    return "|".join(parts)


def _cat(xs):
    if xs and hasattr(xs[0], "detach"):
        import torch

        return torch.cat(list(xs))
    return np.concatenate([np.asarray(x, dtype=np.int64) for x in xs]) if xs else np.empty(0, dtype=np.int64)


def decode_rows(batch) -> list:
    """A launched batch's decode requests: all of a decode batch, the tail of a mixed one (extend rows first)."""
    if batch.forward_mode == "decode":
        return list(batch.reqs)
    if batch.forward_mode == "mixed":
        return list(batch.reqs[len(batch.extend_lens):])
    return []


def launch_seq_lens(batch) -> list[int]:
    """The decode rows' sequence lengths, read at launch: ``prepare_for_decode`` has just allocated their slot
    (``kv_committed_len`` is the length with it) and nothing changes them before the step's result lands. The
    batch's own ``decode_seq_lens_sum`` (taken in ``prepare_for_decode``) must agree; a replay read elsewhere
    would not."""
    lens = [r.kv.kv_committed_len for r in decode_rows(batch)]
    if lens and sum(lens) != batch.decode_seq_lens_sum:
        raise RuntimeError(f"decode lengths read off the rows sum to {sum(lens)}, but prepare_for_decode summed "
                           f"{batch.decode_seq_lens_sum}: read them at launch")
    return lens


def batch_lengths(batch) -> tuple[list, list, list, list]:
    """(prefill requests, their (prefix, extend) lengths, decode requests, their seq lens) of a launched batch."""
    dec = decode_rows(batch)
    if batch.forward_mode == "decode":
        return [], [], dec, launch_seq_lens(batch)
    n = len(batch.extend_lens)
    return list(batch.reqs[:n]), list(zip(batch.prefix_lens, batch.extend_lens)), dec, launch_seq_lens(batch)


def pool_digest(batch) -> dict[str, str]:
    """One fingerprint per pool of the server that launched ``batch``, taken when the step launches."""
    tree = batch.tree_cache
    alloc = tree.token_to_kv_pool_allocator
    pool = batch.req_to_token_pool
    ext, lens, dec, seq = batch_lengths(batch)
    rows = [r.kv.req_pool_idx for r in ext + dec]
    ends = [p + e for p, e in lens] + seq
    table = pool.req_to_token
    mapped = _cat([table[row, :end] for row, end in zip(rows, ends)])
    staged = getattr(alloc, "staged", [])
    digest = {
        "KV allocator free list": _checksum(alloc.free_pages, _cat(staged)) if staged else _checksum(alloc.free_pages),
        "req_to_token rows": _checksum(rows, ends, mapped),
        "request-row free list": _checksum(pool.free_slots),
        "radix tree sizes": _checksum([tree.evictable_size(), tree.protected_size(), tree.mamba_evictable_size()]),
    }
    mamba = getattr(pool, "mamba_allocator", None)
    if mamba is not None:
        digest["mamba state slots"] = _checksum(mamba.free_slots, [r.kv.mamba_pool_idx for r in ext + dec])
    return digest


class ReferenceRun:
    """The numpy simulation's side: records each step's digest and shape, and returns the model's time."""

    device = None

    def __init__(self):
        self.digests: list[dict[str, str]] = []
        self.shapes: list[StepShape] = []

    def mamba_config(self, mamba):
        return mamba

    def step_time(self, clock, servers):
        def step(batch):
            self.digests.append(pool_digest(batch))
            self.shapes.append(StepShape.of(batch))
            return clock(batch)
        return step


class CpuTimer:
    """Wall time between marks (the CPU path; its numbers only exercise the plumbing)."""

    def __init__(self, device):
        self.marks = []

    def start(self):
        self.marks = [("start", time.perf_counter())]

    def mark(self, label):
        self.marks.append((label, time.perf_counter()))

    def parts(self) -> dict:
        return _sum_by_label((b[0], b[1] - a[1]) for a, b in zip(self.marks, self.marks[1:]))


def _sum_by_label(pairs) -> dict:
    """Seconds per label (a layer's mixer and MLP segments share its label)."""
    out: dict = {}
    for label, t in pairs:
        out[label] = out.get(label, 0.0) + t
    return out


class CudaTimer:
    """CUDA events between marks, read after one synchronize at the end of the step."""

    def __init__(self, device):
        import torch

        self.torch = torch
        self.marks = []

    def _event(self):
        e = self.torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def start(self):
        self.marks = [("start", self._event())]

    def mark(self, label):
        self.marks.append((label, self._event()))

    def parts(self) -> dict:
        self.torch.cuda.synchronize()
        return _sum_by_label((b[0], a[1].elapsed_time(b[1]) / 1e3) for a, b in zip(self.marks, self.marks[1:]))


# Decode CUDA graphs as SGLang 0.5.23 captures and replays them.
SEQ_LEN_FILL_VALUE = 1  # get_cuda_graph_seq_len_fill_value of the triton and flashinfer backends
# (layers/attention/triton_backend.py:1440, flashinfer_backend.py:1353): a padded request's seq_len


def decode_capture_bs(max_bs: int, num_max_requests: int) -> list[int]:
    """The decode batch sizes SGLang captures a CUDA graph for: generate_decode_cuda_graph_batch_sizes
    (arg_groups/cuda_graph_hook.py:500-532; no speculative decoding, padding on) for ``cuda_graph_max_bs``, then
    get_batch_sizes_to_capture (model_executor/runner/base_cuda_graph_runner.py:65-110; alignment 1, i.e. no
    attention DP or two-batch overlap), which appends the request-row count when the list passes it and drops
    the sizes above it. ``max_bs`` 0 (graphs off): none."""
    if max_bs <= 0:
        return []
    bs = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, max_bs + 1, 32))
    bs = [b for b in bs if b <= max_bs]
    if max_bs not in bs:
        bs.append(max_bs)
    if max(bs) > num_max_requests:
        bs.append(num_max_requests)
    return sorted({b for b in bs if b <= num_max_requests})


class CudaGraphRunner:
    """SGLang's decode CUDA-graph runner over the stand-in forward. A decode batch of up to ``max(capture_bs)``
    requests (can_run_graph, decode_cuda_graph_runner.py:886-890) is padded to the smallest captured size not below
    it (_pad_to_bucket, base_cuda_graph_runner.py:165-180) with SGLang's padding values: request row 0, KV slot 0
    and seq_len SEQ_LEN_FILL_VALUE (cuda_graph_buffer_registry.py:600-660, the registry zeroes or fills the padded
    tail), state slot -1 (hybrid_linear_attn_backend.py:779-785). Larger decode batches, prefill and mixed batches
    run eager. With ``capture`` (CUDA), each bucket's graph-safe segments are captured the first time the bucket is
    used, after one eager warm-up on a side stream (that time is kept apart in ``capture_s``), and replayed from
    static input buffers; segments that are not graph-safe (MoE) run eager between them. Without (a CPU), the
    padded batch runs eager: the bucket choice and padding are the same."""

    def __init__(self, forward, capture_bs: list[int], capture: bool):
        self.forward, self.capture_bs, self.capture = forward, list(capture_bs), capture
        self.captured: dict[int, list] = {}  # bucket -> [(label, graph | None, fn, static in, static out)]
        self.static: dict[int, tuple] = {}  # bucket -> (StepInputs, live, ids) buffers the graphs read
        self.capture_s = 0.0
        self.replays: dict[int, int] = {}  # bucket -> decode steps run at that padded size
        self._pool = None

    def bucket(self, forward_mode: str, batch_size: int) -> int | None:
        """The padded batch size a step replays at, None when it runs eager."""
        if forward_mode != "decode" or not self.capture_bs or batch_size > self.capture_bs[-1]:
            return None
        return self.capture_bs[bisect.bisect_left(self.capture_bs, batch_size)]

    @staticmethod
    def pad(inp, bs: int):
        """A decode step's inputs padded to ``bs`` requests, and the live mask (1 real, 0 padding)."""
        import torch

        n = inp.dec_rows.numel()

        def fill(t, value):
            return torch.cat([t, torch.full((bs - n,), value, dtype=t.dtype, device=t.device)])

        live = fill(torch.ones(n, dtype=torch.float32, device=inp.dec_rows.device), 0.0)
        padded = dataclasses.replace(inp, dec_rows=fill(inp.dec_rows, 0),
                                     dec_seq_lens=fill(inp.dec_seq_lens, SEQ_LEN_FILL_VALUE),
                                     dec_loc=fill(inp.dec_loc, 0),
                                     dec_slots=None if inp.dec_slots is None else fill(inp.dec_slots, -1))
        return padded, live

    def run(self, inp, bs: int, timer, step_seed: int):
        """The step at padded size ``bs``; returns the real rows' logits. ``timer`` is started by the caller."""
        n = inp.dec_rows.numel()
        padded, live = self.pad(inp, bs)
        ids = self.forward.token_ids(bs, step_seed)
        self.replays[bs] = self.replays.get(bs, 0) + 1
        if not self.capture:
            return self.forward.forward(padded, timer, step_seed, live=live)[:n]
        if bs not in self.captured:
            self._capture(bs, padded, live, ids)
            timer.start()  # the capture is not part of the step
        static_inp, static_live, static_ids = self.static[bs]
        for field in ("dec_rows", "dec_seq_lens", "dec_loc", "dec_slots"):
            if getattr(padded, field) is not None:
                getattr(static_inp, field).copy_(getattr(padded, field))
        static_live.copy_(live)
        static_ids.copy_(ids)
        x = None
        for label, graph, fn, static_in, static_out in self.captured[bs]:
            if graph is None:
                x = fn(x)
            else:
                if static_in is not None and x is not static_in:
                    static_in.copy_(x)
                graph.replay()
                x = static_out
            timer.mark(label)
        return x[:n]

    def _capture(self, bs, padded, live, ids):
        import torch

        t0 = time.perf_counter()
        static_inp = dataclasses.replace(padded, **{f: getattr(padded, f).clone() for f in (
            "dec_rows", "dec_seq_lens", "dec_loc") + (("dec_slots",) if padded.dec_slots is not None else ())})
        static = (static_inp, live.clone(), ids.clone())
        segs = self.forward.segments(static_inp, static[2], static[1])
        self._warm_up(segs)
        entries, x = [], None
        for label, safe, fn in segs:
            if not safe:  # runs eager at replay; the next graph reads a static copy of its output
                x = fn(x)
                entries.append((label, None, fn, None, None))
                x = torch.empty_like(x)
                continue
            graph, out = self._capture_segment(fn, x)
            entries.append((label, graph, fn, x, out))
            x = out
        self._synchronize()
        self.captured[bs], self.static[bs] = entries, static
        self.capture_s += time.perf_counter() - t0

    # the CUDA pieces of a capture (a CPU test stands fakes in for them to check the static-buffer plumbing)
    def _warm_up(self, segs):
        """One eager pass on a side stream before capturing: cuBLAS workspaces, Triton compilation, autotuning."""
        import torch

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x = None
            for _, _, fn in segs:
                x = fn(x)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()

    def _capture_segment(self, fn, x):
        """A CUDA graph of ``fn(x)`` (``x`` its static input), and its static output, holding real values."""
        import torch

        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()  # one pool for every bucket, as SGLang shares one
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = fn(x)
        graph.replay()  # real values in ``out``: an eager segment after it reads them
        return graph, out

    def _synchronize(self):
        import torch

        torch.cuda.synchronize()

    def summary(self) -> dict:
        return {"capture_bs": self.capture_bs, "captured": sorted(self.captured), "capture": self.capture,
                "capture_s": round(self.capture_s, 3),
                "steps_per_bucket": {str(b): n for b, n in sorted(self.replays.items())}}


@dataclasses.dataclass
class ReplayOptions:
    device: str = "cpu"
    tiny: bool = False
    layers: str = "unit"
    max_steps: int | None = None  # measure at most this many steps (the pools are still checked every step)
    budget_s: float | None = None  # stop measuring after this many seconds of replay
    warmup: int = 2  # untimed forwards before the first timed step of each kind
    triton_steps: int = 0  # the first N measured decode steps run the Triton kernels (TRITON_INTERPRET=1 on a CPU)
    seed: int = 0
    repeat: int = 1  # replay (and fit) this many times; runs after the first are compared with it (REPEAT_AGREE)
    synthetic: object = None  # a callable(shape) -> seconds that stands in for the measurement (CPU tests)


ACTIVATION_COPIES = 4  # live [tokens, width] tensors of a segment: input, its norm, the projection, the activation


class _WeightShapes:
    """The stand-in's weights as meta tensors (shapes and dtypes, no storage): their bytes and the widest
    projection a step's tokens pass through (the vocabulary aside: only the last tokens reach the LM head)."""

    def __init__(self, model, dims, layer_ids, dtype):
        import torch

        from poolsim.kernels.standin import StandInForward

        class Meta(StandInForward):
            def _w(self, *shape, scale=None):
                return torch.empty(*shape, dtype=self.dtype, device="meta")

            def _f32(self, t):
                return t.to("meta")

        f = Meta(model, dims, layer_ids, "meta", dtype)
        tensors = [f.embed, f.lm_head, f.final_norm] + [w for ws in f.layers.values() for w in ws.values()
                                                        if isinstance(w, torch.Tensor)]
        self.bytes = sum(t.numel() * t.element_size() for t in tensors)
        self.widest = max([dims.hidden] + [w.shape[-1] for ws in f.layers.values() for w in ws.values()
                                           if isinstance(w, torch.Tensor) and w.dim() >= 2])


class _Server:
    """One server's device-side extras: its KV buffers, the stand-in weights and a mirror req_to_token table."""

    def __init__(self, sched, model, plan, dims, layer_ids, opts: ReplayOptions, capture_bs: list[int]):
        import torch

        from poolsim.kernels.standin import StandInForward, kv_torch_dtype
        from poolsim.pools.mem_cache.pool.mha import MHATokenToKVPool
        from poolsim.pools.mem_cache.pool.mla import MLATokenToKVPool

        attn = [i for i in layer_ids if model.layers[i].mixer == "attention"]
        size, page = sched.config.max_total_num_tokens, sched.page_size
        if model.use_mla:
            self.kv = MLATokenToKVPool(size, page, plan.kv_cache_dtype, dims.kv_lora_rank, dims.qk_rope, len(attn),
                                       device=opts.device)
        else:
            self.kv = MHATokenToKVPool(size, page, plan.kv_cache_dtype, dims.kv_heads, dims.head_dim, len(attn),
                                       device=opts.device, v_head_dim=dims.v_head_dim)
        pool = sched.req_to_token_pool
        dtype = getattr(torch, model.dtype) if torch.device(opts.device).type == "cuda" else torch.float32
        self.forward = StandInForward(model, dims, layer_ids, opts.device, dtype, seed=opts.seed, kv_pool=self.kv,
                                      mamba_pool=getattr(pool, "mamba_pool", None), req_to_token=pool.req_to_token,
                                      kv_dtype=kv_torch_dtype(plan.kv_cache_dtype))
        self.pool = pool
        self.mirror = torch.zeros_like(pool.req_to_token)  # written only by the write_req_to_token kernel
        self.graphs = CudaGraphRunner(self.forward, capture_bs, capture=torch.device(opts.device).type == "cuda")


class DeviceReplay:
    """The step-time hook of the device run (see the module docstring)."""

    def __init__(self, model, plan, opts: ReplayOptions, reference: list[dict] | None = None,
                 cuda_graph_max_bs: int = 0):
        """``cuda_graph_max_bs``: SGLang's decode graph limit for this server (the step-time model's
        ``ModelCost.cuda_graph_max_bs``; 0: graphs off, every step eager)."""
        from poolsim.kernels.standin import Dims, select_layers

        self.model, self.plan, self.opts = model, plan, opts
        self.device = opts.device
        self.dims = Dims.tiny(model) if opts.tiny else Dims.of(model, plan.tp_size)
        self.layer_ids, self.layer_scale = select_layers(model, opts.layers)
        self.reference = reference
        self.capture_bs = decode_capture_bs(cuda_graph_max_bs, plan.max_running_requests)
        self.rows: list[dict] = []  # one per measured step (STEP_FIELDS)
        self.shapes: list[StepShape] = []
        self.step = 0
        self.pool_checked = 0
        self.warmup_s = 0.0
        self.replay_s = 0.0
        self.triton_checked = 0
        self.stopped = None  # why measuring stopped early (max steps, budget)
        self._servers: dict[int, _Server] = {}
        self._warm: set = set()
        self._t0 = None
        import torch

        self.timer_cls = CudaTimer if torch.device(opts.device).type == "cuda" else CpuTimer

    # -- before anything is allocated ------------------------------------------------------------
    def memory_estimate(self, args, shapes: list[StepShape]) -> dict[str, int]:
        """Bytes this replay will allocate on its device, by what holds them: per server (``args.dp_size``) its KV
        pool at the planned size (the stand-in's per-layer shapes, the run attention layers only), the
        req_to_token table and the kernel's mirror of it, the state pool, the KV free lists (plus the step
        digest's int64 copies); the stand-in weights; and the largest step's activations (``shapes``: the
        reference run's steps): ACTIVATION_COPIES of its widest projection, the logits, and where the reference
        attention runs the gathered keys/values of the longest context and three copies of a query block's scores.
        An estimate (allocator rounding and the kernels' small temporaries are left out), to refuse a run that
        cannot fit before it starts rather than to be exact."""
        import torch

        from poolsim import kernels
        from poolsim.app.run import mamba_config, scheduler_config
        from poolsim.kernels.standin import SCORE_BLOCK_BYTES
        from poolsim.pools.mem_cache.pool.mamba import MambaPool
        from poolsim.pools.mem_cache.pool.mha import MHATokenToKVPool
        from poolsim.pools.mem_cache.pool.mla import MLATokenToKVPool

        model, plan, d, dev = self.model, self.plan, self.dims, torch.device(self.device)
        config = scheduler_config(plan, args)
        servers = args.dp_size
        attn = [i for i in self.layer_ids if model.layers[i].mixer == "attention"]
        size, page = config.max_total_num_tokens, config.page_size
        if model.use_mla:
            kv = MLATokenToKVPool(size, page, plan.kv_cache_dtype, d.kv_lora_rank, d.qk_rope, len(attn))
        else:
            kv = MHATokenToKVPool(size, page, plan.kv_cache_dtype, d.kv_heads, d.head_dim, len(attn),
                                  v_head_dim=d.v_head_dim)
        kv_bytes = kv.get_kv_size_bytes()
        mamba = self.mamba_config(mamba_config(plan, args, config.enable_overlap))
        state = MambaPool(mamba.max_mamba_cache_size, mamba.cache_params) if mamba else None
        width = config.max_context_len or config.context_len
        dtype = getattr(torch, model.dtype) if dev.type == "cuda" else torch.float32  # as _Server's
        weights = _WeightShapes(model, d, self.layer_ids, dtype)
        tokens = max((sum(s.extend_lens) + len(s.decode_seq_lens) for s in shapes), default=0)
        reqs = max((len(s.reqs) for s in shapes), default=0)
        context = max((p + e for s in shapes for p, e in zip(s.prefix_lens, s.extend_lens)), default=0)
        context = max([context] + [max(s.decode_seq_lens) for s in shapes if s.decode_seq_lens])
        act = ACTIVATION_COPIES * tokens * weights.widest * dtype.itemsize + 2 * reqs * d.vocab * dtype.itemsize
        if attn and kernels.implementation("extend_attention", torch.empty(0, device=dev)) == "naive":
            head_dim = max(d.head_dim, d.v_head_dim, d.mla_dim)
            pairs = max((e * (p + e) for s in shapes for p, e in zip(s.prefix_lens, s.extend_lens)), default=0)
            # fp32 keys and values per q head; a block's scores, their softmax and the mask
            act += 2 * d.heads * context * head_dim * 4 + 3 * min(SCORE_BLOCK_BYTES, 4 * d.heads * pairs)
        return {
            "KV pool": servers * (sum(kv_bytes) if isinstance(kv_bytes, tuple) else kv_bytes),
            "req_to_token and its mirror": servers * 2 * (config.max_running_requests + 1) * width * 4,
            "state pool": servers * (state.conv_state_bytes() + state.ssm_state_bytes()) if state else 0,
            "free lists": (servers + 3) * 8 * (size + (plan.swa_max_total_num_tokens or 0)),
            "stand-in weights": servers * weights.bytes,
            "largest step's activations": act,
        }

    # -- simulate() hooks -------------------------------------------------------------------------
    def mamba_config(self, mamba):
        """The device state pool: the stand-in's shapes, over the run linear layers only."""
        if mamba is None:
            return None
        from poolsim.kernels.standin import LINEAR_MIXERS

        params = mamba.cache_params
        lin = [i for i in self.layer_ids if self.model.layers[i].mixer in LINEAR_MIXERS]
        shape = self.dims.state_shape(self.model.linear_attn.kind) if self.opts.tiny else params.shape
        return dataclasses.replace(mamba, cache_params=dataclasses.replace(params, shape=shape, layers=lin))

    def step_time(self, clock, servers):
        self.clock = clock
        for s in servers:
            self._servers[id(s.req_to_token_pool)] = _Server(s, self.model, self.plan, self.dims, self.layer_ids,
                                                             self.opts, self.capture_bs)
        self._t0 = time.perf_counter()
        return self._step

    # -- one step ---------------------------------------------------------------------------------
    def _step(self, batch) -> float:
        i = self.step
        self.step += 1
        predicted = self.clock(batch)
        if self.reference is not None:
            self._check_pools(i, batch)
        server = self._servers[id(batch.req_to_token_pool)]
        inp = self._inputs(batch, server)
        # the Triton kernels on the first decode steps; under the CPU interpreter only on small ones (its cost
        # grows with the context read)
        triton = (self.triton_checked < self.opts.triton_steps and batch.forward_mode == "decode"
                  and (self.timer_cls is CudaTimer or batch.decode_seq_lens_sum <= INTERPRETER_MAX_CONTEXT))
        self._check_write_req_to_token(i, inp, server, triton)
        if self._measuring(i):
            self._measure(i, batch, inp, server, predicted, triton)
        return predicted

    def _measuring(self, i: int) -> bool:
        if self.stopped:
            return False
        if self.opts.max_steps is not None and len(self.rows) >= self.opts.max_steps:
            self.stopped = f"--max-steps {self.opts.max_steps} reached at step {i}"
        elif self.opts.budget_s is not None and time.perf_counter() - self._t0 > self.opts.budget_s:
            self.stopped = f"--budget-s {self.opts.budget_s:g} reached at step {i}"
        return not self.stopped

    def _check_pools(self, i, batch):
        if i >= len(self.reference):
            raise PoolMismatch(i, "the step count", f"the simulation ran {len(self.reference)} steps")
        got, want = pool_digest(batch), self.reference[i]
        for name, value in want.items():
            if got.get(name) != value:
                raise PoolMismatch(i, name)
        self.pool_checked += 1

    def _inputs(self, batch, server):
        import torch

        from poolsim.kernels.standin import StepInputs

        dev = torch.device(self.device)
        ext, lens, dec, seq = batch_lengths(batch)
        table = server.pool.req_to_token
        as_t = lambda xs: torch.tensor(xs, dtype=torch.int64, device=dev)  # noqa: E731
        ext_rows = as_t([r.kv.req_pool_idx for r in ext])
        prefix, extend = as_t([p for p, _ in lens]), as_t([e for _, e in lens])
        ext_loc = torch.cat([table[r.kv.req_pool_idx, p:p + e] for r, (p, e) in zip(ext, lens)]).long() \
            if ext else as_t([])
        dec_rows, dec_seq = as_t([r.kv.req_pool_idx for r in dec]), as_t(seq)
        dec_loc = table[dec_rows, dec_seq - 1].long() if dec else as_t([])
        slots = lambda reqs: as_t([r.kv.mamba_pool_idx for r in reqs]) if server.forward.mamba_pool else None  # noqa
        return StepInputs(ext_rows, prefix, extend, ext_loc, dec_rows, dec_seq, dec_loc, slots(ext), slots(dec))

    def _check_write_req_to_token(self, i, inp, server, triton):
        """The kernel writes this step's rows into the mirror table; they must equal the simulator's rows."""
        import contextlib

        import torch

        from poolsim import kernels

        table, mirror = server.pool.req_to_token, server.mirror
        ctx = kernels.use_backend("fused") if triton else contextlib.nullcontext()
        with ctx:
            if inp.ext_rows.numel():
                seq = inp.prefix_lens + inp.extend_lens
                prefix_loc = torch.cat([table[r, :p] for r, p in zip(inp.ext_rows.tolist(),
                                                                     inp.prefix_lens.tolist())])
                kernels.write_req_to_token(mirror, inp.ext_rows, inp.prefix_lens, seq, inp.ext_loc, prefix_loc.long())
            if inp.dec_rows.numel():
                kernels.write_req_to_token(mirror, inp.dec_rows, inp.dec_seq_lens - 1, inp.dec_seq_lens, inp.dec_loc)
        # what the kernel wrote this step: prefill rows [0, prefix + extend), decode rows their new position
        spans = [(r, 0, p + e) for r, p, e in zip(inp.ext_rows.tolist(), inp.prefix_lens.tolist(),
                                                  inp.extend_lens.tolist())]
        spans += [(r, s - 1, s) for r, s in zip(inp.dec_rows.tolist(), inp.dec_seq_lens.tolist())]
        if spans:  # row slices are views: one cat per table, one compare
            if not torch.equal(torch.cat([mirror[r, a:b] for r, a, b in spans]),
                               torch.cat([table[r, a:b] for r, a, b in spans])):
                r, a, b = next((r, a, b) for r, a, b in spans if not torch.equal(mirror[r, a:b], table[r, a:b]))
                pos = a + int((mirror[r, a:b] != table[r, a:b]).nonzero()[0])
                raise PoolMismatch(i, "req_to_token rows written by write_req_to_token",
                                   f"row {r} position {pos}: the kernel wrote {int(mirror[r, pos])}, "
                                   f"the pool holds {int(table[r, pos])}")

    def _measure(self, i, batch, inp, server, predicted, triton):
        import contextlib

        import torch

        from poolsim import kernels

        shape = StepShape.of(batch)
        timer = self.timer_cls(self.device)
        ctx = kernels.use_backend("fused") if triton else contextlib.nullcontext()
        with ctx, torch.no_grad():
            key = (shape.kind, id(server))
            if key not in self._warm:  # first step of its kind: warm up (and autotune) untimed
                t = time.perf_counter()
                for _ in range(self.opts.warmup):
                    timer.start()
                    server.forward.forward(inp, timer, step_seed=i)
                    timer.parts()
                self.warmup_s += time.perf_counter() - t
                self._warm.add(key)
            bucket = server.graphs.bucket(batch.forward_mode, len(shape.reqs))
            timer.start()
            if bucket is None:  # prefill, mixed, or above the largest graph: eager
                logits = server.forward.forward(inp, timer, step_seed=i)
            else:
                logits = server.graphs.run(inp, bucket, timer, step_seed=i)
            parts = timer.parts()
        if not bool(torch.isfinite(logits).all()):
            raise PoolMismatch(i, "stand-in forward output", "non-finite logits")
        if triton:
            self.triton_checked += 1
        forward_s = sum(t * (self.layer_scale.get(label, 1.0) if isinstance(label, int) else 1.0)
                        for label, t in parts.items())
        measured = self.opts.synthetic(shape) if self.opts.synthetic is not None else forward_s
        ext_tokens = sum(shape.extend_lens)
        ctx_tokens = sum(p + e for p, e in zip(shape.prefix_lens, shape.extend_lens)) + sum(shape.decode_seq_lens)
        self.shapes.append(shape)
        self.rows.append(dict(step=i, kind=shape.kind, batch_size=len(shape.reqs), graph_bs=bucket or 0,
                              extend_tokens=ext_tokens,
                              decode_tokens=len(shape.decode_seq_lens), context_tokens=ctx_tokens,
                              predicted_s=predicted, measured_s=measured, forward_s=forward_s))

    # -- after the run ----------------------------------------------------------------------------
    def graphs_summary(self) -> dict:
        """The decode graph buckets (capture_bs), those captured, capture time, steps per padded size."""
        runners = [s.graphs for s in self._servers.values()]
        per_bucket: dict[str, int] = {}
        for r in runners:
            for b, n in r.replays.items():
                per_bucket[str(b)] = per_bucket.get(str(b), 0) + n
        return {"capture_bs": self.capture_bs, "captured": sorted({b for r in runners for b in r.captured}),
                "mode": "cuda graphs" if any(r.capture for r in runners) else "padded, eager (no CUDA)",
                "capture_s": round(sum(r.capture_s for r in runners), 3),
                "decode_steps_per_bucket": dict(sorted(per_bucket.items(), key=lambda kv: int(kv[0])))}

    def guard_slots_untouched(self) -> list[str]:
        """The padding page of every KV buffer and state slot 0 must still be zero (nothing wrote there)."""
        bad = []
        for s in self._servers.values():
            page = self.plan.page_size
            bufs = getattr(s.kv, "kv_buffer", None) or (s.kv.k_buffer + s.kv.v_buffer)
            if any(bool(b[:page].any()) for b in bufs):
                bad.append("KV padding page")
            mp = s.forward.mamba_pool
            if mp is not None and (bool(mp.temporal[:, 0].any()) or any(bool(c[:, 0].any()) for c in mp.conv)):
                bad.append("mamba slot 0")
        return bad
