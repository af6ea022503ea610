"""Check every poolsim kernel against its torch reference in bf16 at real shapes, then time it on the GPU.

Shapes: Kimi-Linear KDA (H = HV = 32, K = V = 128, fp32 state pool, conv over 3*32*128 channels, width 4),
Kimi-Linear MLA (32 heads over a 512 + 64 latent), Llama-3-70B at tp8 (8 query heads on 1 KV head of 128).
Bandwidth is the compulsory HBM traffic of a call divided by its time, as a fraction of the H200's 4.8 TB/s
spec and ~4.3 TB/s realistic copy ceiling (../shared/KDA.md section 6); decode attention counts the KV once per
head tile that reads it (each tile of 16 query heads is its own program). Timed calls rotate over disjoint sets
of slots / rows / sources sized from the device's L2 (``L2_cache_size``): the sets of one rotation together
exceed twice the L2, so a set is out of L2 when its turn comes again; where the pool cannot hold that many sets
(tiny stores), the row says so and its GB/s is not an HBM figure. A rotation is replayed from one CUDA graph so
small batches are not launch-bound. Each row is the median over ``reps`` timed replays with the min-max spread;
the first (eager) pass, where Triton compiles and fla autotunes, is excluded and reported as ``warm-up``.

    python bench/kernels_gpu.py             # on a CUDA machine (~3 min on an H200)
    python bench/kernels_gpu.py --dry-run   # anywhere: tiny fp32 shapes through Triton's CPU interpreter

The table (markdown and CSV) goes to --out, else $OUT when set.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HBM_SPEC = 4.8e12  # B/s, H200 SXM
HBM_REAL = 4.3e12  # B/s, a realistic measured copy ceiling
MiB = 2**20


@dataclass
class Shapes:
    batches: list[int]
    heads: int  # KDA H = HV
    head_dim: int  # KDA K = V
    state_slots: int
    conv_width: int
    conv_slots: int
    gqa_q_heads: int
    gqa_kv_heads: int
    gqa_dim: int
    mla_heads: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    mla_scale_dim: int  # qk_nope + qk_rope: the MLA softmax scale is its -1/2 power
    seq_len: int
    kv_pool_tokens: int
    prefill_tokens: int
    prefill_lens: list[int]
    sweep_batch: int
    max_sets: int = 2048  # calls in one rotation (one CUDA graph), at most
    reps: int = 7  # timed replays of a rotation: median and spread
    l2_bytes: int | None = None  # None: the device's L2_cache_size


REAL = Shapes(batches=[1, 8, 64, 256], heads=32, head_dim=128, state_slots=2048, conv_width=4, conv_slots=8192,
              gqa_q_heads=8, gqa_kv_heads=1, gqa_dim=128, mla_heads=32, kv_lora_rank=512, qk_rope_head_dim=64,
              mla_scale_dim=192, seq_len=4096, kv_pool_tokens=2 * 2**20, prefill_tokens=32768,
              prefill_lens=[1, 63, 700, 2048, 4096, 1285], sweep_batch=256)
DRY = Shapes(batches=[1, 3], heads=2, head_dim=16, state_slots=40, conv_width=4, conv_slots=40,
             gqa_q_heads=4, gqa_kv_heads=1, gqa_dim=16, mla_heads=4, kv_lora_rank=32, qk_rope_head_dim=8,
             mla_scale_dim=24, seq_len=40, kv_pool_tokens=1000, prefill_tokens=16, prefill_lens=[1, 20, 70],
             sweep_batch=3, max_sets=3, reps=2, l2_bytes=2048)  # an L2 both rotation notes show up against


def size(nbytes: float) -> str:
    return f"{nbytes / MiB:.0f} MiB" if nbytes >= MiB else f"{nbytes / 1024:.1f} KiB"


@dataclass
class Timing:
    """Seconds per call: the median over ``samples`` timed passes and their spread; the untimed warm-up pass."""

    median: float
    lo: float
    hi: float
    samples: int
    warmup_s: float = 0.0

    @staticmethod
    def of(per_call: list[float], warmup_s: float = 0.0) -> "Timing":
        xs = sorted(per_call)
        mid = len(xs) // 2
        median = xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
        return Timing(median, xs[0], xs[-1], len(xs), warmup_s)


@dataclass
class Row:
    kernel: str
    shape: str
    batch: int
    timing: Timing
    bytes: int
    note: str = ""

    @property
    def seconds(self) -> float:
        return self.timing.median

    def cells(self) -> list[str]:
        t = self.timing
        bw = self.bytes / t.median if t.median > 0 else 0.0
        return [self.kernel, self.shape, str(self.batch), f"{t.median * 1e6:.1f}",
                f"{t.lo * 1e6:.1f}-{t.hi * 1e6:.1f} (n={t.samples})", f"{bw / 1e9:.0f}",
                f"{bw / HBM_SPEC:.0%}", f"{bw / HBM_REAL:.0%}", f"{t.warmup_s:.2f}", self.note]


HEADER = ["kernel", "shape", "batch", "us/call (median)", "min-max us", "GB/s", "of 4.8 TB/s", "of 4.3 TB/s",
          "warm-up s", "note"]
CSV_HEADER = ["kernel", "shape", "batch", "seconds", "bytes", "seconds_min", "seconds_max", "samples", "warmup_s",
              "note"]


@dataclass
class Report:
    checks: list[tuple[str, str, str]] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def check(self, name: str, err: float | None, tol: float | None, detail: str = "") -> None:
        if err is None:
            verdict = f"skipped: {detail}"
        else:
            verdict = f"{'PASS' if err <= tol else 'FAIL'} rel-RMS {err:.2e} (tol {tol:.0e}){' ' + detail if detail else ''}"
        self.checks.append((name, verdict, ""))
        print(f"check {name}: {verdict}", flush=True)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print(" | ".join(row.cells()), flush=True)


class Bench:
    def __init__(self, torch, shapes: Shapes, dry_run: bool):
        self.torch = torch
        self.s = shapes
        self.dry = dry_run
        self.dev = "cpu" if dry_run else "cuda"
        self.dtype = torch.float32 if dry_run else torch.bfloat16  # the interpreter's bf16 arithmetic is wrong
        self.report = Report()
        self.gen = torch.Generator(device=self.dev).manual_seed(0)
        self.l2 = shapes.l2_bytes if shapes.l2_bytes is not None else int(getattr(
            torch.cuda.get_device_properties(0), "L2_cache_size", 50 * MiB))

    # ---------------------------------------------------------------- helpers
    def randn(self, *shape, dtype=None, scale=1.0):
        t = self.torch.randn(*shape, device=self.dev, generator=self.gen, dtype=self.torch.float32)
        return (t * scale).to(dtype or self.dtype)

    def perm(self, n: int, start: int = 1):
        return self.torch.randperm(n - start, device=self.dev, generator=self.gen) + start

    def per_call(self, calls) -> Timing:
        """Seconds per call: one eager pass (compile, autotune, index checks: the warm-up, timed apart), then
        ``reps`` timed passes over the whole rotation, each a CUDA-graph replay between two events."""
        torch = self.torch
        t0 = time.perf_counter()
        for c in calls:
            c()
        if not self.dry:
            torch.cuda.synchronize()
        warmup = time.perf_counter() - t0
        samples = []
        if self.dry:
            for _ in range(self.s.reps):
                t0 = time.perf_counter()
                for c in calls:
                    c()
                samples.append((time.perf_counter() - t0) / len(calls))
            return Timing.of(samples, warmup)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for c in calls:
                c()
        graph.replay()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(self.s.reps + 1)]
        events[0].record()
        for e in events[1:]:
            graph.replay()
            e.record()
        torch.cuda.synchronize()
        return Timing.of([a.elapsed_time(b) / 1e3 / len(calls) for a, b in zip(events, events[1:])], warmup)

    def sets(self, batch: int, capacity: int, bytes_per_call: int) -> tuple[int, str]:
        """The rotation: how many disjoint batches of ``batch`` units (of ``capacity``) to cycle through so that
        together they exceed twice the L2, capped by the pool and ``max_sets``; and the row's note about it."""
        want = -(-2 * self.l2 // max(1, bytes_per_call))
        r = max(1, min(self.s.max_sets, capacity // max(1, batch), want))
        touched = r * bytes_per_call
        if r >= want:
            return r, f"rotating {r} sets ({size(touched)} > 2x L2)"
        return r, f"rotating {r} sets: {size(touched)} fits in 2x L2 ({size(self.l2)}), GB/s not HBM"

    # ---------------------------------------------------------------- checks at real shapes
    def run_checks(self, k):
        from poolsim.kernels.ops.conv1d_update import naive as conv_naive
        from poolsim.kernels.ops.decode_attention import naive as att_naive
        from poolsim.kernels.ops.kda_decode import naive as kda_naive
        from poolsim.kernels.ops.store_kv import naive as store_naive
        from poolsim.kernels.ops.write_req_to_token import naive as w_naive
        from poolsim.kernels.testing import rel_rms_error

        torch, s, dev, rep = self.torch, self.s, self.dev, self.report
        n = min(64, s.state_slots - 1)

        # write_req_to_token: exact
        seq = torch.randint(1, s.seq_len + 1, (n,), device=dev, generator=self.gen)
        pre = (torch.rand(n, device=dev, generator=self.gen) * seq).long()
        rows = self.perm(n + 1)[:n]
        loc = torch.randint(1, s.kv_pool_tokens, (int((seq - pre).sum()),), device=dev, generator=self.gen)
        ref = torch.full((n + 1, s.seq_len), -1, dtype=torch.int32, device=dev)
        out = ref.clone()
        w_naive.write_req_to_token(ref, rows, pre, seq, loc)
        k["write_req_to_token"].write_req_to_token(out, rows, pre, seq, loc)
        rep.check("write_req_to_token", 0.0 if torch.equal(ref, out) else float("inf"), 0.0, "(exact)")

        # store_kv GQA and MLA: exact copies
        kb = torch.full((4096, s.gqa_kv_heads, s.gqa_dim), float("nan"), dtype=self.dtype, device=dev)
        vb, kb_ref, vb_ref = kb.clone(), kb.clone(), kb.clone()
        loc = self.perm(4096)[:n]
        kk, vv = self.randn(n, s.gqa_kv_heads, s.gqa_dim), self.randn(n, s.gqa_kv_heads, s.gqa_dim)
        store_naive.store_kv(kb_ref, vb_ref, loc, kk, vv)
        k["store_kv"].store_kv(kb, vb, loc, kk, vv)
        same = all(torch.equal(a.view(torch.int16 if a.element_size() == 2 else torch.int32),
                               b.view(torch.int16 if b.element_size() == 2 else torch.int32))
                   for a, b in ((kb, kb_ref), (vb, vb_ref)))
        rep.check("store_kv gqa", 0.0 if same else float("inf"), 0.0, "(bit-exact, NaN guard rows)")
        lat = s.kv_lora_rank + s.qk_rope_head_dim
        mb = torch.zeros(4096, 1, lat, dtype=self.dtype, device=dev)
        mb_ref = mb.clone()
        nope, rope = self.randn(n, 1, s.kv_lora_rank), self.randn(n, 1, s.qk_rope_head_dim)
        store_naive.store_mla_kv(mb_ref, loc, nope, rope)
        k["store_kv"].store_mla_kv(mb, loc, nope, rope)
        rep.check("store_mla_kv nope+rope", 0.0 if torch.equal(mb, mb_ref) else float("inf"), 0.0, "(exact)")

        # decode attention, GQA and MLA, ragged lengths incl. 1 and the full context
        m = min(16, n)
        lens = torch.randint(1, s.seq_len + 1, (m,), device=dev, generator=self.gen)
        lens[0], lens[-1] = 1, s.seq_len
        table = torch.zeros(m + 1, s.seq_len, dtype=torch.int32, device=dev)
        perm = self.perm(s.kv_pool_tokens)
        for i in range(m):
            table[i + 1, :s.seq_len] = perm[i * s.seq_len:(i + 1) * s.seq_len].to(torch.int32)
        rows = torch.arange(1, m + 1, device=dev)
        kb = self.randn(s.kv_pool_tokens, s.gqa_kv_heads, s.gqa_dim)
        vb = self.randn(s.kv_pool_tokens, s.gqa_kv_heads, s.gqa_dim)
        q = self.randn(m, s.gqa_q_heads, s.gqa_dim)
        ref = att_naive.decode_attention(q.float(), kb, vb, table, rows, lens)
        out = k["decode_attention"].decode_attention(q, kb, vb, table, rows, lens)
        rep.check("decode_attention gqa", rel_rms_error(ref, out), 1e-2)
        mb = self.randn(s.kv_pool_tokens, 1, lat)
        q = self.randn(m, s.mla_heads, lat)
        scale = s.mla_scale_dim ** -0.5
        ref = att_naive.decode_attention(q.float(), mb, mb[..., :s.kv_lora_rank], table, rows, lens, sm_scale=scale)
        out = k["decode_attention"].decode_attention(q, mb, mb[..., :s.kv_lora_rank], table, rows, lens,
                                                     sm_scale=scale)
        rep.check("decode_attention mla", rel_rms_error(ref, out), 1e-2)
        del kb, vb, mb

        # KDA decode on a small pool with padding slots
        inputs = self.kda_inputs(n)
        pool = self.randn(n + 21, s.heads, s.head_dim, s.head_dim, dtype=torch.float32, scale=0.1)
        order = self.perm(n + 21)
        slots = order[:n].clone()
        slots[::7] = -1  # padding requests
        ref_pool = pool.clone()
        ref = kda_naive.kda_decode(*[t.float() for t in inputs], ref_pool, slots)
        out = k["kda_decode"].kda_decode(*inputs, pool, slots)
        rep.check("kda_decode o", rel_rms_error(ref, out), 1e-2)
        rep.check("kda_decode state", rel_rms_error(ref_pool, pool), 1e-3)
        if importlib.util.find_spec("fla") is not None:  # the timing baseline; fla 0.6.0 does not skip slot -1
            live = slots.clone()
            live[::7] = order[n:n + len(live[::7])]  # unused slots stand in for the pads
            fla_pool, ref_pool = pool.clone(), pool.clone()
            ref = kda_naive.kda_decode(*[t.float() for t in inputs], ref_pool, live)
            o = self.fla_decode(inputs, fla_pool, live)
            rep.check("fla fused_recurrent_kda (baseline) o", rel_rms_error(ref, o), 1e-2)
            rep.check("fla fused_recurrent_kda (baseline) state", rel_rms_error(ref_pool, fla_pool), 1e-3)

        # conv1d update on the pool's transposed view
        dim = 3 * s.heads * s.head_dim
        conv = self.randn(n + 21, s.conv_width - 1, dim)
        conv_ref = conv.clone()
        x, w, bias = self.randn(n, dim), self.randn(dim, s.conv_width, dtype=torch.float32), None
        ref = conv_naive.conv1d_update(x, conv_ref.transpose(-1, -2), w, bias, slots)
        out = k["conv1d_update"].conv1d_update(x, conv.transpose(-1, -2), w, bias, slots)
        rep.check("conv1d_update y", rel_rms_error(ref.float(), out.float()), 1e-2)
        rep.check("conv1d_update state", rel_rms_error(conv_ref.float(), conv.float()), 1e-2)

        self.check_prefill(k)

    def check_prefill(self, k):
        from poolsim.kernels.ops.kda_prefill import naive as prefill_naive
        from poolsim.kernels.testing import rel_rms_error

        torch, s, rep = self.torch, self.s, self.report
        name = k["kda_prefill_name"]
        if k.get("kda_prefill") is None:
            rep.check(name, None, None, "fla-core not installed")
            return
        lens = s.prefill_lens[:4]
        cu = torch.tensor([0] + lens, device=self.dev).cumsum(0)
        inputs = self.kda_inputs(sum(lens))
        pool = self.randn(12, s.heads, s.head_dim, s.head_dim, dtype=torch.float32, scale=0.1)
        slots = torch.tensor([5, -1, 2, 9][:len(lens)], device=self.dev)
        has_init = torch.tensor([True, True, False, True][:len(lens)], device=self.dev)
        ref_pool = pool.clone()
        # the token-by-token torch reference against the kernel path (fla; in the dry run Triton kda_decode steps)
        ref = prefill_naive.kda_prefill_recurrent(*[t.float() for t in inputs], ref_pool, slots, cu, has_init)
        out = k["kda_prefill"].kda_prefill(*inputs, pool, slots, cu, has_init)
        live = slots[slots >= 0]
        rep.check(f"{name} o", rel_rms_error(ref, out.float()), 2e-2)
        rep.check(f"{name} state", rel_rms_error(ref_pool[live], pool[live]), 2e-2)

    # ---------------------------------------------------------------- KDA inputs and the fla baseline
    def kda_inputs(self, n):
        s = self.s
        h, d = s.heads, s.head_dim
        return (self.randn(n, h, d), self.randn(n, h, d), self.randn(n, h, d), self.randn(n, h * d),
                self.randn(n, h), self.randn(h, dtype=self.torch.float32, scale=0.5),
                self.randn(h * d, dtype=self.torch.float32, scale=0.5))

    def fla_decode(self, inputs, pool, slots):
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

        q, k, v, a, b, A_log, dt_bias = inputs
        n, hv, kd = v.shape[0], v.shape[1], q.shape[2]
        cu = self.torch.arange(n + 1, device=self.dev)
        o, _ = fused_recurrent_kda_fwd(
            q=q[None], k=k[None], v=v[None], g=a.view(1, n, hv, kd), beta=b[None], A_log=A_log, dt_bias=dt_bias,
            initial_state=pool, inplace_final_state=True, state_v_first=True, cu_seqlens=cu,
            ssm_state_indices=slots.int(), use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
            use_beta_sigmoid_in_kernel=True)
        return o[0]

    # ---------------------------------------------------------------- timings
    def time_kda_decode(self, k):
        torch, s, rep = self.torch, self.s, self.report
        h, d = s.heads, s.head_dim
        pool = torch.empty(s.state_slots, h, d, d, device=self.dev).normal_(0, 0.1, generator=self.gen)
        fused = k["kda_decode"]
        has_fla = importlib.util.find_spec("fla") is not None
        shape = f"H{h} K{d} V{d}, pool {pool.numel() * 4 / 2**30:.1f} GiB"
        for n in s.batches:
            inputs = self.kda_inputs(n)
            per_req = 2 * h * d * d * 4 + (2 * h * d + 2 * h * d + h * d) * inputs[0].element_size() + h * 2 + 8
            r, rot = self.sets(n, s.state_slots - 1, n * per_req)
            order = self.perm(s.state_slots)
            slot_sets = [order[i * n:(i + 1) * n].contiguous() for i in range(r)]
            calls = [partial(fused.kda_decode, *inputs, pool, sl) for sl in slot_sets]
            rep.add(Row("kda_decode", shape, n, self.per_call(calls), n * per_req, rot))
            if has_fla:
                calls = [partial(self.fla_decode, inputs, pool, sl) for sl in slot_sets]
                rep.add(Row("fla fused_recurrent_kda (baseline)", shape, n, self.per_call(calls), n * per_req,
                            rot + "; warm-up = fla's first call (autotune)"))
            if n == s.sweep_batch:
                for bv, warps in ((16, 1), (32, 1), (32, 2), (64, 2), (64, 4), (128, 4), (128, 8)):
                    if bv > d:
                        continue
                    calls = [partial(fused.kda_decode_fwd, *inputs, pool, sl, d ** -0.5, bv, warps)
                             for sl in slot_sets]
                    rep.add(Row("kda_decode sweep", shape, n, self.per_call(calls), n * per_req,
                                f"BV={bv} num_warps={warps}, {rot}"))

    def time_conv(self, k):
        torch, s, rep = self.torch, self.s, self.report
        dim, w = 3 * s.heads * s.head_dim, s.conv_width
        conv = torch.empty(s.conv_slots, w - 1, dim, device=self.dev, dtype=self.dtype).normal_(generator=self.gen)
        weight = self.randn(dim, w, dtype=torch.float32)
        esz = conv.element_size()
        for n in s.batches:
            nbytes = n * (2 * dim * (w - 1) * esz + 2 * dim * esz + 8) + dim * w * 4
            r, rot = self.sets(n, s.conv_slots - 1, nbytes)
            xs = self.randn(r * n, dim)  # a fresh input per call too: it is part of the traffic
            order = self.perm(s.conv_slots)
            calls = [partial(k["conv1d_update"].conv1d_update, xs[i * n:(i + 1) * n], conv.transpose(-1, -2), weight,
                             None, order[i * n:(i + 1) * n].contiguous()) for i in range(r)]
            rep.add(Row("conv1d_update", f"dim {dim} W{w}, pool {conv.numel() * esz / MiB:.0f} MiB", n,
                        self.per_call(calls), nbytes, rot))

    def attention_batches(self, n: int, r: int):
        """``r`` disjoint request-row sets of ``n`` requests, each with seq_len distinct random KV slots."""
        torch, s = self.torch, self.s
        table = torch.zeros(r * n + 1, s.seq_len, dtype=torch.int32, device=self.dev)
        perm = self.perm(s.kv_pool_tokens).to(torch.int32)
        table[1:] = perm[:r * n * s.seq_len].view(r * n, s.seq_len)
        rows = [torch.arange(1 + i * n, 1 + (i + 1) * n, device=self.dev) for i in range(r)]
        lens = torch.full((n,), s.seq_len, device=self.dev)
        return table, rows, lens

    def time_attention(self, k):
        torch, s, rep = self.torch, self.s, self.report
        att = k["decode_attention"]
        lat = s.kv_lora_rank + s.qk_rope_head_dim
        kb = torch.empty(s.kv_pool_tokens, s.gqa_kv_heads, s.gqa_dim, device=self.dev, dtype=self.dtype).normal_(
            generator=self.gen)
        vb = torch.empty_like(kb).normal_(generator=self.gen)
        mb = torch.empty(s.kv_pool_tokens, 1, lat, device=self.dev, dtype=self.dtype).normal_(generator=self.gen)
        esz = kb.element_size()
        group = s.gqa_q_heads // s.gqa_kv_heads
        kinds = {  # k, v, q heads, scale, KV bytes per token, DK, DV, programs per request (head tiles of 16)
            "gqa": (kb, vb, s.gqa_q_heads, s.gqa_dim ** -0.5, s.gqa_kv_heads * s.gqa_dim * 2 * esz,
                    s.gqa_dim, s.gqa_dim, s.gqa_kv_heads * -(-group // 16),
                    f"Hq{s.gqa_q_heads} Hkv{s.gqa_kv_heads} D{s.gqa_dim}"),
            "mla": (mb, mb[..., :s.kv_lora_rank], s.mla_heads, s.mla_scale_dim ** -0.5, lat * esz, lat,
                    s.kv_lora_rank, -(-s.mla_heads // 16), f"H{s.mla_heads} latent {s.kv_lora_rank}+{s.qk_rope_head_dim}"),
        }
        kv_heads = {"gqa": s.gqa_kv_heads, "mla": 1}
        for kind, (kbuf, vbuf, hq, scale, kv_bytes_per_token, dk, dv, tiles, shape) in kinds.items():
            reads = tiles // kv_heads[kind]  # head tiles reading each KV head's entries (MLA: 32 heads = 2 tiles)
            for n in s.batches:
                # each program (request x head tile) reads its KV head's entries and the slot indices
                nbytes = n * s.seq_len * (kv_bytes_per_token * reads + 4 * tiles) + n * hq * (dk + dv) * esz
                r, rot = self.sets(n * s.seq_len, s.kv_pool_tokens - 1, nbytes)
                table, rows, lens = self.attention_batches(n, r)
                q = self.randn(n, hq, dk)
                label = f"{shape}, ctx {s.seq_len}"
                splits = [None] + ([1, 2, 4, 8, 16] if n == s.sweep_batch else [])
                for sp in splits:
                    calls = [partial(att.decode_attention, q, kbuf, vbuf, table, rw, lens, scale, sp) for rw in rows]
                    note = (f"splits={att.default_num_splits(n, tiles, torch.device(self.dev))} (default)"
                            if sp is None
                            else f"splits={sp}") + f", KV read by {reads} head tile(s), {rot}"
                    rep.add(Row(f"decode_attention {kind}" + ("" if sp is None else " sweep"), label, n,
                                self.per_call(calls), nbytes, note))

    def time_stores(self, k):
        torch, s, rep = self.torch, self.s, self.report
        pool_rows = s.kv_pool_tokens
        lat = s.kv_lora_rank + s.qk_rope_head_dim
        kb = torch.zeros(pool_rows, s.gqa_kv_heads, s.gqa_dim, device=self.dev, dtype=self.dtype)
        vb = torch.zeros_like(kb)
        mb = torch.zeros(pool_rows, 1, lat, device=self.dev, dtype=self.dtype)
        table = torch.zeros(2 * max(s.batches) + 9, s.seq_len + 1, dtype=torch.int32, device=self.dev)
        esz = kb.element_size()
        for t in s.batches + [s.prefill_tokens]:
            gqa_bytes = t * (2 * 2 * s.gqa_kv_heads * s.gqa_dim * esz + 8)
            r, rot = self.sets(t, pool_rows - 1, gqa_bytes)
            order = self.perm(pool_rows)
            locs = [order[i * t:(i + 1) * t].contiguous() for i in range(r)]
            # one source per call, sliced from one allocation: the rotation reads fresh sources too
            ks, vs = self.randn(r * t, s.gqa_kv_heads, s.gqa_dim), self.randn(r * t, s.gqa_kv_heads, s.gqa_dim)
            calls = [partial(k["store_kv"].store_kv, kb, vb, loc, ks[i * t:(i + 1) * t], vs[i * t:(i + 1) * t])
                     for i, loc in enumerate(locs)]
            rep.add(Row("store_kv gqa", f"Hkv{s.gqa_kv_heads} D{s.gqa_dim}", t, self.per_call(calls), gqa_bytes,
                        f"batch = tokens; {rot}"))
            del ks, vs
            mla_bytes = t * (2 * lat * esz + 8)
            r, rot = self.sets(t, pool_rows - 1, mla_bytes)
            lats = self.randn(r * t, 1, lat)
            calls = [partial(k["store_kv"].store_mla_kv, mb, order[i * t:(i + 1) * t].contiguous(),
                             lats[i * t:(i + 1) * t]) for i in range(r)]
            rep.add(Row("store_mla_kv", f"latent {lat}", t, self.per_call(calls), mla_bytes,
                        f"batch = tokens; {rot}"))
            del lats
        # write_req_to_token: decode (one new slot per request) and a prefill batch of whole prompts
        cases = [(n, 1) for n in s.batches] + [(8, s.prefill_tokens // 8)]
        for n, extend in cases:
            if extend > table.shape[1] - 1:
                table = torch.zeros(table.shape[0], extend + 1, dtype=torch.int32, device=self.dev)
            rows = self.perm(table.shape[0])[:n]
            pre = torch.zeros(n, dtype=torch.int64, device=self.dev)
            seq = torch.full((n,), extend, dtype=torch.int64, device=self.dev)
            nbytes = n * extend * (8 + 4) + n * 3 * 8
            r, rot = self.sets(n * extend, 64 * 2**20 // 8, nbytes)  # sources: up to 64 Mi int64 slots
            locs = torch.randint(1, pool_rows, (r * n * extend,), device=self.dev, generator=self.gen)
            calls = [partial(k["write_req_to_token"].write_req_to_token, table, rows, pre, seq,
                             locs[i * n * extend:(i + 1) * n * extend]) for i in range(r)]
            rep.add(Row("write_req_to_token", f"{n} reqs x {extend} new slots", n, self.per_call(calls), nbytes,
                        f"int64 loc -> int32 row; sources {rot}; the same table rows are rewritten each call"))
            del locs

    def time_prefill(self, k):
        torch, s, rep = self.torch, self.s, self.report
        if k.get("kda_prefill") is None:
            rep.notes.append("kda_prefill (fla chunk_kda) not timed: fla-core not installed")
            return
        lens = [s.prefill_tokens // 8] * 8
        total = sum(lens)
        cu = torch.tensor([0] + lens, device=self.dev).cumsum(0)
        h, d = s.heads, s.head_dim
        inputs = self.kda_inputs(total)
        pool = torch.empty(64, h, d, d, device=self.dev).normal_(0, 0.1, generator=self.gen)
        slot_sets = [self.perm(64)[:len(lens)] for _ in range(4)]
        esz = inputs[0].element_size()
        nbytes = total * (5 * h * d * esz + h * esz) + len(lens) * 2 * h * d * d * 4
        fn = k["kda_prefill"].kda_prefill
        t0 = time.perf_counter()
        fn(*inputs, pool, slot_sets[0], cu)  # warm-up: compile and autotune (fla's first call), reported apart
        if not self.dry:
            torch.cuda.synchronize()
        warmup = time.perf_counter() - t0
        calls = [slot_sets[i % len(slot_sets)] for i in range(max(self.s.reps, len(slot_sets)))]
        if self.dry:
            samples = []
            for sl in calls:
                t0 = time.perf_counter()
                fn(*inputs, pool, sl, cu)
                samples.append(time.perf_counter() - t0)
        else:  # CUDA events around each call, no host sync until the end (fla's own syncs stay inside the calls)
            events = [torch.cuda.Event(enable_timing=True) for _ in range(len(calls) + 1)]
            events[0].record()
            for sl, e in zip(calls, events[1:]):
                fn(*inputs, pool, sl, cu)
                e.record()
            torch.cuda.synchronize()
            samples = [a.elapsed_time(b) / 1e3 for a, b in zip(events, events[1:])]
        timing = Timing.of(samples, warmup)
        rep.add(Row(k["kda_prefill_name"], f"H{h} K{d} V{d}, {len(lens)} x {lens[0]} tokens", total, timing,
                    nbytes, f"eager, {total / timing.median / 1e6:.1f} M tokens/s; batch = tokens; warm-up = first "
                    "call (compile, autotune)"))


class StepwiseKdaPrefill:
    """``kda_prefill``'s contract (variable-length sequences, state slots, -1 padding, has_initial_state) run as
    the Triton ``kda_decode`` one token at a time: a Triton path the CPU interpreter can run, so the dry run checks
    a kernel against the token-by-token reference instead of the reference against itself."""

    def __init__(self, decode_module):
        self.decode = decode_module.kda_decode

    def kda_prefill(self, q, k, v, a, b, A_log, dt_bias, ssm_states, slot_indices, cu_seqlens,
                    has_initial_state=None):
        import torch

        o = torch.zeros_like(v)
        cu, slots = cu_seqlens.tolist(), slot_indices.tolist()
        for i, slot in enumerate(slots):
            pool, at = ssm_states, slot_indices[i:i + 1]
            if slot < 0:  # prefill runs a padding sequence from a zero state and keeps nothing: a scratch slot
                pool, at = torch.zeros_like(ssm_states[:1]), torch.zeros_like(at)
            elif has_initial_state is not None and not bool(has_initial_state[i]):
                ssm_states[slot] = 0  # no initial state: start from zero
            for t in range(cu[i], cu[i + 1]):
                o[t:t + 1] = self.decode(q[t:t + 1], k[t:t + 1], v[t:t + 1], a[t:t + 1], b[t:t + 1], A_log, dt_bias,
                                         pool, at)
        return o


def load_fused(dry: bool):
    import importlib

    ops = ["write_req_to_token", "store_kv", "decode_attention", "kda_decode", "conv1d_update"]
    k = {op: importlib.import_module(f"poolsim.kernels.ops.{op}.fused") for op in ops}
    if dry:  # fla's chunk_kda autotunes, which the interpreter cannot: the Triton kda_decode stepped per token
        k["kda_prefill"] = StepwiseKdaPrefill(k["kda_decode"])
        k["kda_prefill_name"] = "kda_prefill (dry run: Triton kda_decode stepped per token, for fla)"
    else:
        k["kda_prefill"] = (importlib.import_module("poolsim.kernels.ops.kda_prefill.fused")
                            if importlib.util.find_spec("fla") is not None else None)
        k["kda_prefill_name"] = "kda_prefill (fla chunk_kda)"
    return k


def environment(torch, dry: bool) -> list[str]:
    import triton

    lines = [f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
             f"torch {torch.__version__}, triton {triton.__version__}, python {platform.python_version()}"]
    if importlib.util.find_spec("fla") is not None:
        from importlib.metadata import version

        lines.append(f"fla-core {version('fla-core')}")
    if dry:
        lines.append("device: CPU, Triton interpreter (--dry-run): times are NOT performance numbers")
    else:
        p = torch.cuda.get_device_properties(0)
        lines.append(f"device: {p.name}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB")
    return lines


def write_tables(report: Report, env: list[str], out: Path | None) -> str:
    lines = ["# poolsim kernels: bf16 checks and timings", ""] + [f"- {e}" for e in env] + [""]
    lines += ["## Checks against the torch references", "", "| check | result |", "| --- | --- |"]
    lines += [f"| {name} | {verdict} |" for name, verdict, _ in report.checks]
    lines += ["", "## Timings (per call: median and min-max over timed passes; warm-up excluded; bytes = compulsory "
              "HBM traffic)", "",
              "| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in report.rows]
    if report.notes:
        lines += [""] + [f"- {n}" for n in report.notes]
    text = "\n".join(lines) + "\n"
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "kernels_gpu.md").write_text(text)
        with open(out / "kernels_gpu.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(CSV_HEADER)
            for r in report.rows:
                t = r.timing
                w.writerow([r.kernel, r.shape, r.batch, f"{t.median:.9f}", r.bytes, f"{t.lo:.9f}", f"{t.hi:.9f}",
                            t.samples, f"{t.warmup_s:.3f}", r.note])
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny fp32 shapes on CPU through Triton's interpreter")
    ap.add_argument("--out", type=Path, default=None, help="folder for kernels_gpu.md/.csv (default: $OUT)")
    ap.add_argument("--skip-timing", action="store_true", help="run the checks only")
    ap.add_argument("--budget-s", type=float, default=270.0,
                    help="start no timing part after this many seconds (the parts run most important first)")
    args = ap.parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    import torch

    if args.dry_run:  # tiny tensors: one intra-op thread (spinning thread pools cost CPU time on a shared machine)
        torch.set_num_threads(1)

    if not args.dry_run and not torch.cuda.is_available():
        print("kernels_gpu.py: no CUDA device here, so there is nothing to benchmark. "
              "Run it on a GPU machine, or use --dry-run to exercise the script on CPU.", file=sys.stderr)
        return 2
    if importlib.util.find_spec("triton") is None:
        print("kernels_gpu.py: triton is not installed (pip install -e '.[gpu]').", file=sys.stderr)
        return 2
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    t_start = time.perf_counter()
    bench = Bench(torch, DRY if args.dry_run else REAL, args.dry_run)
    k = load_fused(args.dry_run)
    env = environment(torch, args.dry_run)
    print("\n".join(env), flush=True)
    bench.run_checks(k)
    write_tables(bench.report, env, out)  # partial results survive a timeout
    if not args.skip_timing:
        print(" | ".join(HEADER), flush=True)
        for part in (bench.time_kda_decode, bench.time_attention, bench.time_conv, bench.time_stores,
                     bench.time_prefill):
            if time.perf_counter() - t_start > args.budget_s:
                bench.report.notes.append(f"{part.__name__} skipped: past the {args.budget_s:.0f} s budget")
                continue
            part(k)
            if not args.dry_run:
                torch.cuda.empty_cache()
            write_tables(bench.report, env, out)
    bench.report.notes.append(f"wall time {time.perf_counter() - t_start:.0f} s")
    text = write_tables(bench.report, env, out)
    print("\n" + text)
    failed = [c for c in bench.report.checks if c[1].startswith("FAIL")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
