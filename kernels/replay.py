"""Device replay: the simulation's own steps, with the servers' pools on a torch device and a step-time hook that
checks the pools, runs the stand-in forward over them and measures it, then returns the model's time so the
schedule is exactly the simulation's (the replay measures, it does not steer).

    sim.run.simulate(..., replay=ReferenceRun())      numpy pools: one digest of the pools per step
    sim.run.simulate(..., replay=DeviceReplay(...))   torch pools on the device: the same digests, checked per
                                                      step (first mismatch stops the run naming step and pool),
                                                      write_req_to_token's output against the simulator's rows,
                                                      the stand-in forward timed, outputs finite
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

INTERPRETER_MAX_CONTEXT = 2048  # context tokens a decode step may read to run under TRITON_INTERPRET on a CPU
STEP_FIELDS = ("step", "kind", "batch_size", "extend_tokens", "decode_tokens", "context_tokens", "predicted_s",
               "measured_s", "forward_s")


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

    __slots__ = ("forward_mode", "prefix_lens", "extend_lens", "decode_seq_lens", "reqs")

    def __init__(self, forward_mode, prefix_lens, extend_lens, decode_seq_lens, num_reqs):
        self.forward_mode = forward_mode
        self.prefix_lens, self.extend_lens, self.decode_seq_lens = prefix_lens, extend_lens, decode_seq_lens
        self.reqs = range(num_reqs)  # the model only counts them

    @staticmethod
    def of(batch) -> "StepShape":
        return StepShape(batch.forward_mode, list(batch.prefix_lens), list(batch.extend_lens),
                         list(batch.decode_seq_lens) if batch.forward_mode != "extend" else [], len(batch.reqs))

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


def batch_lengths(batch) -> tuple[list, list, list, list]:
    """(prefill requests, their (prefix, extend) lengths, decode requests, their seq lens) of a launched batch."""
    if batch.forward_mode == "decode":
        return [], [], list(batch.reqs), list(batch.decode_seq_lens)
    n = len(batch.extend_lens)
    ext = list(zip(batch.prefix_lens, batch.extend_lens))
    dec = list(batch.reqs[n:]) if batch.forward_mode == "mixed" else []
    return list(batch.reqs[:n]), ext, dec, list(batch.decode_seq_lens) if dec else []


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
        return {b[0]: b[1] - a[1] for a, b in zip(self.marks, self.marks[1:])}


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
        return {b[0]: a[1].elapsed_time(b[1]) / 1e3 for a, b in zip(self.marks, self.marks[1:])}


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
    synthetic: object = None  # a callable(shape) -> seconds that stands in for the measurement (CPU tests)


class _Server:
    """One server's device-side extras: its KV buffers, the stand-in weights and a mirror req_to_token table."""

    def __init__(self, sched, model, plan, dims, layer_ids, opts: ReplayOptions):
        import torch

        from kernels.standin import StandInForward
        from pools.kv_cache import MHATokenToKVPool, MLATokenToKVPool

        attn = [i for i in layer_ids if model.layers[i].mixer == "attention"]
        size, page = sched.config.max_total_num_tokens, sched.page_size
        if plan.kv_cache_dtype.startswith("fp8"):
            raise ValueError(f"--kv-cache-dtype {plan.kv_cache_dtype}: the stand-in forward stores bf16/fp16/fp32 KV "
                             "only (fp8 stored as uint8 is not wired into store_kv/decode_attention yet)")
        if model.use_mla:
            self.kv = MLATokenToKVPool(size, page, plan.kv_cache_dtype, dims.kv_lora_rank, dims.qk_rope, len(attn),
                                       device=opts.device)
        else:
            self.kv = MHATokenToKVPool(size, page, plan.kv_cache_dtype, dims.kv_heads, dims.head_dim, len(attn),
                                       device=opts.device, v_head_dim=dims.v_head_dim)
        pool = sched.req_to_token_pool
        dtype = getattr(torch, model.dtype) if torch.device(opts.device).type == "cuda" else torch.float32
        self.forward = StandInForward(model, dims, layer_ids, opts.device, dtype, seed=opts.seed, kv_pool=self.kv,
                                      mamba_pool=getattr(pool, "mamba_pool", None), req_to_token=pool.req_to_token)
        self.pool = pool
        self.mirror = torch.zeros_like(pool.req_to_token)  # written only by the write_req_to_token kernel


class DeviceReplay:
    """The step-time hook of the device run (see the module docstring)."""

    def __init__(self, model, plan, opts: ReplayOptions, reference: list[dict] | None = None):
        from kernels.standin import Dims, select_layers

        self.model, self.plan, self.opts = model, plan, opts
        self.device = opts.device
        self.dims = Dims.tiny(model) if opts.tiny else Dims.of(model, plan.tp_size)
        self.layer_ids, self.layer_scale = select_layers(model, opts.layers)
        self.reference = reference
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

    # -- simulate() hooks -------------------------------------------------------------------------
    def mamba_config(self, mamba):
        """The device state pool: the stand-in's shapes, over the run linear layers only."""
        if mamba is None:
            return None
        from pools.mamba_pool import MambaStateShape

        params = mamba.cache_params
        lin = [i for i in self.layer_ids if self.model.layers[i].mixer == "kda"]
        shape = params.shape
        if self.opts.tiny:
            shape = MambaStateShape.kimi_linear(1, self.dims.lin_heads, self.dims.lin_head_dim, self.dims.conv_kernel)
        return dataclasses.replace(mamba, cache_params=dataclasses.replace(params, shape=shape, layers=lin))

    def step_time(self, clock, servers):
        self.clock = clock
        for s in servers:
            self._servers[id(s.req_to_token_pool)] = _Server(s, self.model, self.plan, self.dims, self.layer_ids,
                                                             self.opts)
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
                  and (self.timer_cls is CudaTimer or sum(batch.decode_seq_lens) <= INTERPRETER_MAX_CONTEXT))
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

        from kernels.standin import StepInputs

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

        import kernels

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

        import kernels

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
            timer.start()
            logits = server.forward.forward(inp, timer, step_seed=i)
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
        self.rows.append(dict(step=i, kind=shape.kind, batch_size=len(shape.reqs), extend_tokens=ext_tokens,
                              decode_tokens=len(shape.decode_seq_lens), context_tokens=ctx_tokens,
                              predicted_s=predicted, measured_s=measured, forward_s=forward_s))

    # -- after the run ----------------------------------------------------------------------------
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
