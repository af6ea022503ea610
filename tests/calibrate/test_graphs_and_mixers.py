"""Decode CUDA-graph buckets and padding (SGLang 0.5.23's lists), the GDN and Mamba2 stand-in mixers, the
two-runs-agree comparison, and the tiny Qwen3-Next / Nemotron-H replays on the CPU."""

import json
import math

import pytest
from typer.testing import CliRunner

from poolsim.cli import app
from tests.calibrate.util import generate_trace

torch = pytest.importorskip("torch")

from poolsim.kernels import calibrate as cal  # noqa: E402
from poolsim.kernels.replay import CudaGraphRunner, decode_capture_bs  # noqa: E402
from poolsim.kernels.standin import StepInputs, gdn_gate_as_kda, mamba2_decode, mamba2_prefill  # noqa: E402

runner = CliRunner()
SMALL = ["--max-total-tokens", "16000", "--context-length", "4096"]
HEAD = [1, 2, 4, 8, 12] + list(range(16, 257, 8))  # generate_decode_cuda_graph_batch_sizes up to 256


def test_decode_capture_bs_follows_sglang():
    # H100/H200 tier, tp < 4: max_bs 256 -> 1, 2, 4, 8, 12, then every 8 from 16 to 256 (36 sizes)
    assert decode_capture_bs(256, 4096) == HEAD and len(HEAD) == 36
    # tp >= 4: max_bs 512 -> then every 16 from 272 to 496, and 512 (from range(512, 513, 32))
    assert decode_capture_bs(512, 4096) == HEAD + list(range(272, 512, 16)) + [512]
    # a max_bs off the list is appended (--max-running-requests 100 caps max_bs at 100)
    assert decode_capture_bs(100, 4096) == [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 100]
    # fewer request rows than max_bs: sizes above the rows go, the row count comes in (81 rows)
    assert decode_capture_bs(256, 81) == [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 81]
    assert decode_capture_bs(0, 81) == []  # --disable-cuda-graph


def test_bucket_choice_and_padding():
    graphs = CudaGraphRunner(forward=None, capture_bs=decode_capture_bs(256, 81), capture=False)
    assert [graphs.bucket("decode", n) for n in (1, 3, 5, 12, 13, 80, 81)] == [1, 4, 8, 12, 16, 80, 81]
    assert graphs.bucket("decode", 82) is None  # above the largest graph: eager
    assert graphs.bucket("extend", 3) is None and graphs.bucket("mixed", 3) is None  # prefill, mixed: eager
    assert CudaGraphRunner(None, [], capture=False).bucket("decode", 1) is None  # graphs off

    t = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
    e = t([])
    inp = StepInputs(e, e, e, e, dec_rows=t([5, 9, 7]), dec_seq_lens=t([40, 12, 3]), dec_loc=t([101, 102, 103]),
                     ext_slots=None, dec_slots=t([4, 2, 6]))
    padded, live = CudaGraphRunner.pad(inp, 8)
    # SGLang's padding: request row 0, seq_len 1 (the triton/flashinfer fill value), KV slot 0, state slot -1
    assert padded.dec_rows.tolist() == [5, 9, 7, 0, 0, 0, 0, 0]
    assert padded.dec_seq_lens.tolist() == [40, 12, 3, 1, 1, 1, 1, 1]
    assert padded.dec_loc.tolist() == [101, 102, 103, 0, 0, 0, 0, 0]
    assert padded.dec_slots.tolist() == [4, 2, 6, -1, -1, -1, -1, -1]
    assert live.tolist() == [1, 1, 1, 0, 0, 0, 0, 0] and padded.num_tokens == 8


def _one(*xs):
    return torch.tensor(xs, dtype=torch.float64)


def test_mamba2_decode_by_hand():
    """H = P = G = N = 1: A_log 0 (A = -1), dt 0 + bias 0 -> softplus = ln 2, so exp(dt A) = 1/2;
    s = 2 * 1/2 + ln2 * x * B = 1 + 3 ln 2, y = C s + D x = (1 + 3 ln 2) / 2 + 3. Row 2 is a padding row (-1)."""
    pool = torch.zeros(3, 1, 1, 1, dtype=torch.float64)
    pool[1] = 2.0
    x = _one(3.0, 7.0).view(2, 1, 1)
    B, C = _one(1.0, 1.0).view(2, 1, 1), _one(0.5, 0.5).view(2, 1, 1)
    y = mamba2_decode(x, B, C, _one(0.0, 0.0).view(2, 1), _one(0.0), _one(0.0), _one(1.0), pool,
                      torch.tensor([1, -1]))
    s = 1 + 3 * math.log(2)
    assert y[0].item() == pytest.approx(s / 2 + 3, rel=1e-6) and y[1].item() == 0.0
    assert pool[1].item() == pytest.approx(s, rel=1e-6)
    assert pool[0].item() == 0.0 and pool[2].item() == 0.0  # slot 0 (the padding row's read) left as it was


def test_mamba2_prefill_chunks_equal_the_token_steps():
    """Chunks of 4 over sequences of 1, 6 and 9 tokens (one chunk, a chunk boundary, two) give what stepping
    mamba2_decode token by token gives; slot -1 gives zeros, has_initial_state False starts from zero."""
    g = torch.Generator().manual_seed(0)
    H, P, G, N, lens = 4, 3, 2, 5, [1, 6, 9]
    T = sum(lens)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    x, B, C, dt = r(T, H, P), r(T, G, N), r(T, G, N), r(T, H)
    A_log, dt_bias, D = r(H) * 0.3, r(H) * 0.3, r(H)
    pool = r(8, H, P, N)
    ref = pool.clone()
    slots, init = torch.tensor([2, 5, 3]), torch.tensor([True, True, False])
    slots[1] = -1
    cu = torch.tensor([0, 1, 7, 16])
    y = mamba2_prefill(x, B, C, dt, A_log, dt_bias, D, pool, slots, cu, init, chunk=4)
    ref[3] = 0.0  # sequence 3 has no initial state
    want = torch.zeros_like(y)
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        for t in range(cu[i], cu[i + 1]):
            want[t:t + 1] = mamba2_decode(x[t:t + 1], B[t:t + 1], C[t:t + 1], dt[t:t + 1], A_log, dt_bias, D, ref,
                                          torch.tensor([slot]))
    assert torch.allclose(y, want, rtol=1e-5, atol=1e-6)
    assert torch.allclose(pool, ref, rtol=1e-5, atol=1e-6) and y[1:7].abs().max() == 0


def test_gdn_scalar_gate_through_the_kda_decode_op():
    """One GDN step by hand through kernels.kda_decode (the reference): K = 2, V = 1, one k head shared by 2 value
    heads; k = q = [1, 0] (unit norm), scale 2^-1/2; A_log 0; a 0 with dt_bias [0, ln(e - 1)] -> per-head decay
    exp(-softplus) = [1/2, 1/e] on both key channels; b 0 -> beta 1/2; v = [4, 6].
    head 0: S = [2, 5] / 2 = [1, 2.5]; u = (4 - 1) / 2 = 1.5; S = [2.5, 2.5]; o = 2.5 / sqrt 2.
    head 1: S = 0; u = 6 / 2 = 3; S = [3, 0]; o = 3 / sqrt 2."""
    from poolsim import kernels

    a, dt_bias = gdn_gate_as_kda(torch.zeros(1, 2, dtype=torch.float64), _one(0.0, math.log(math.e - 1)), 2)
    L = math.log(math.e - 1)
    assert a.tolist() == [[0, 0, 0, 0]] and dt_bias.tolist() == pytest.approx([0, 0, L, L])  # repeated per channel
    pool = torch.zeros(3, 2, 1, 2, dtype=torch.float64)  # [slots, HV, V, K]
    pool[1, 0, 0] = _one(2.0, 5.0)
    qk = _one(1.0, 0.0).view(1, 1, 2)
    with kernels.use_backend("naive"):
        o = kernels.kda_decode(qk, qk.clone(), _one(4.0, 6.0).view(1, 2, 1), a, torch.zeros(1, 2, dtype=torch.float64),
                               _one(0.0, 0.0), dt_bias, pool, torch.tensor([1]))
    # l2norm divides by sqrt(|x|^2 + 1e-6): q and k are each 5e-7 short of unit norm
    assert o.flatten().tolist() == pytest.approx([2.5 / math.sqrt(2), 3 / math.sqrt(2)], rel=2e-6)
    assert pool[1].flatten().tolist() == pytest.approx([2.5, 2.5, 3.0, 0.0], rel=2e-6)


def test_compare_runs_by_hand():
    first = cal.run_summary(["decode", "decode", "prefill"], [0.010, 0.012, 0.050], ["decode", "decode", "prefill"],
                            [0.011, 0.011, 0.049], {"mfu_sm90": 0.5})
    assert first["median_step_s"] == {"decode": pytest.approx(0.011), "prefill": 0.050}
    assert first["fitted_total_s"] == {"decode": pytest.approx(0.022), "prefill": 0.049}
    # medians 0.0112 (+1.8 %) and 0.0535 (+7 %); fitted totals equal; mfu +20 % (reported, not deciding)
    other = {"median_step_s": {"decode": 0.0112, "prefill": 0.0535}, "fitted_total_s": first["fitted_total_s"],
             "coefficients": {"mfu_sm90": 0.6}}
    cmp = cal.compare_runs(first, other)
    assert cmp["worst"] == "median prefill step" and cmp["max_rel_diff"] == pytest.approx(0.07)
    assert cmp["agree"] is False and cmp["coefficients_max_rel_diff"] == pytest.approx(0.2)
    other["median_step_s"]["prefill"] = 0.051  # +2 %: within 3 %
    assert cal.compare_runs(first, other)["agree"] is True


@pytest.fixture(scope="module")
def tiny_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "tiny.jsonl"
    return generate_trace(path, "--sessions", "4", "--rate", "6", "--turns", "fixed:1",
                          "--system-prompt-len", "100", "--input-len", "uniform:30,200", "--output-len",
                          "uniform:4,10")


@pytest.mark.parametrize("model, extra, kinds", [
    ("qwen3-next-80b-a3b", ["--tp", "2"], {"gdn+moe": 36, "attention+moe": 12}),  # 80B: two H200s
    ("nemotron-3-nano-30b-a3b", [], {"mamba2+none": 23, "none+moe": 23, "attention+none": 6}),
    ("lfm2-700m", [], {"short_conv+dense": 10, "attention+dense": 6}),  # full_attn_idxs 2, 5, 8, 10, 12, 14
])
def test_calibrate_tiny_hybrids(tiny_trace, tmp_path, model, extra, kinds):
    out = tmp_path / "cal"
    res = runner.invoke(app, ["calibrate", str(tiny_trace), "--model", model, "--gpu", "H200", *extra, *SMALL,
                              "--device", "cpu", "--tiny", "--max-steps", "8", "--triton-steps", "1", "--out",
                              str(out)])
    assert res.exit_code == 0, res.output
    rec = json.loads((out / "calibration.json").read_text())
    assert rec["layers"]["per_kind"] == kinds and len(rec["layers"]["run"]) == len(kinds)
    assert rec["pool_check"]["mismatches"] == 0 and rec["pool_check"]["guard_slots"] == "untouched"
    assert rec["pool_check"]["steps"] == rec["replay"]["steps"] > 8 and rec["replay"]["measured"] == 8
    assert rec["pool_check"]["triton_steps"] == 1
    graphs = rec["replay"]["graphs"]
    assert graphs["mode"] == "padded, eager (no CUDA)" and graphs["captured"] == []
    assert set(graphs["decode_steps_per_bucket"]) <= {str(b) for b in graphs["capture_bs"]}
    steps = (out / "steps.csv").read_text().splitlines()
    header = steps[0].split(",")
    rows = [dict(zip(header, line.split(","))) for line in steps[1:]]
    for row in rows:  # decode steps at their bucket, prefill eager
        want = CudaGraphRunner(None, graphs["capture_bs"], False).bucket(
            "decode" if row["kind"] == "decode" else "extend", int(row["batch_size"]))
        assert int(row["graph_bs"]) == (want or 0)


class _FakeGraph:
    """Stands in for a CUDA graph on a CPU: replay recomputes the captured segment from its static input into its
    static output, as a real replay rewrites the captured output buffer from whatever the input buffers hold."""

    def __init__(self, fn, x, out):
        self.fn, self.x, self.out = fn, x, out

    def replay(self):
        self.out.copy_(self.fn(self.x))


class _FakeCaptureRunner(CudaGraphRunner):
    def _warm_up(self, segs):
        pass

    def _capture_segment(self, fn, x):
        out = fn(x)
        return _FakeGraph(fn, x, out), out

    def _synchronize(self):
        pass


@pytest.mark.parametrize("model_name", ["llama-3.1-8b", "qwen3-30b-a3b"])  # dense; MoE (eager between graphs)
def test_graph_replay_reads_each_steps_inputs(model_name):
    """The capture path's plumbing on a CPU (fake graphs): every step's padded inputs are copied into the static
    buffers the graphs read, an eager MoE segment's output into the next graph's input, and the logits equal an
    eager forward over the same padded inputs. (Requires CUDA for the real capture: test_calibrate_on_cuda_tiny.)"""
    from poolsim.kernels.replay import CpuTimer
    from poolsim.kernels.standin import Dims, StandInForward, select_layers
    from poolsim.pools.mem_cache.pool.mha import MHATokenToKVPool
    from poolsim.pools.model.config import ModelConfig

    model = ModelConfig.load(model_name)
    dims = Dims.tiny(model)
    layer_ids, _ = select_layers(model, "unit")
    kv = MHATokenToKVPool(100, 1, "float32", dims.kv_heads, dims.head_dim, len(layer_ids), device="cpu",
                          v_head_dim=dims.v_head_dim)
    table = torch.zeros(6, 16, dtype=torch.int32)  # row 0 unused (the padding row), rows 1-5: slots 1-80
    table[1:] = torch.arange(1, 81, dtype=torch.int32).reshape(5, 16)
    forward = StandInForward(model, dims, layer_ids, "cpu", torch.float32, kv_pool=kv, req_to_token=table)
    graphs = _FakeCaptureRunner(forward, [1, 2, 4, 8], capture=True)
    t = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731

    def step(rows, lens):
        rows, lens = t(rows), t(lens)
        return StepInputs(t([]), t([]), t([]), t([]), rows, lens, table[rows, lens - 1].long(), None, None)

    timer = CpuTimer("cpu")
    for i, (rows, lens) in enumerate([([1, 2, 3], [5, 3, 7]), ([4, 2], [9, 4]), ([5, 1, 3], [2, 6, 8])]):
        inp = step(rows, lens)
        bs = graphs.bucket("decode", len(rows))
        assert bs == 4 if len(rows) == 3 else bs == 2
        timer.start()
        got = graphs.run(inp, bs, timer, step_seed=i)
        padded, live = CudaGraphRunner.pad(inp, bs)
        want = forward.forward(padded, CpuTimer("cpu"), step_seed=i, live=live)[:len(rows)]
        assert got.shape == want.shape and torch.equal(got, want), i
        labels = [m[0] for m in timer.marks[1:]]
        assert labels == ["embed", *[lid for lid in layer_ids for _ in range(2)], "head"]
    assert sorted(graphs.captured) == [2, 4] and graphs.replays == {4: 2, 2: 1}
    eager = [e[0] for e in graphs.captured[4] if e[1] is None]
    assert eager == ([] if model_name == "llama-3.1-8b" else layer_ids)  # the MoE segments stay eager
    assert kv.k_buffer[0][0].abs().max() == 0  # padding rows (zero hidden state) stored zeros into slot 0
