"""Calibration memory safety: the stand-in prefill attention in bounded query blocks, and the up-front check of
what a replay will allocate against what the device has."""

import pytest

torch = pytest.importorskip("torch")


def _case(seed=0):
    """Two prefill requests (one with a cached prefix, one a fresh prompt) and an empty one, on 4 q / 2 kv heads."""
    g = torch.Generator().manual_seed(seed)
    rows, width, hq, hkv, dk, dv = 4, 64, 4, 2, 16, 8
    k_buf = torch.randn(200, hkv, dk, generator=g)
    v_buf = torch.randn(200, hkv, dv, generator=g)
    req_to_token = torch.zeros(rows, width, dtype=torch.int32)
    req_to_token[1, :40] = torch.randperm(199, generator=g)[:40].int() + 1
    req_to_token[3, :23] = torch.randperm(199, generator=g)[:23].int() + 1
    ext_rows, prefix, extend = (torch.tensor(x) for x in ([1, 2, 3], [13, 0, 0], [27, 0, 23]))
    q = torch.randn(50, hq, dk, generator=g)
    return q, k_buf, v_buf, req_to_token, ext_rows, prefix, extend


def test_query_blocks_split_each_request_into_bounded_blocks():
    from poolsim.kernels.standin import query_blocks

    rows, prefix, extend = (torch.tensor(x) for x in ([1, 2, 3], [13, 0, 0], [27, 0, 23]))
    # request 1: 40 keys, 4 heads: 4 * 4 * 40 = 640 score bytes per query row; 6400 bytes -> blocks of 10 rows
    # request 3: 23 keys: 368 bytes per row -> blocks of 17; the empty request 2 has none
    r, p, e = query_blocks(rows, prefix, extend, heads=4, max_bytes=6400)
    assert r.tolist() == [1, 1, 1, 3, 3]
    assert p.tolist() == [13, 23, 33, 0, 17]
    assert e.tolist() == [10, 10, 7, 17, 6]
    # a budget below one row still makes progress: one query row per block
    r, p, e = query_blocks(rows[:1], prefix[:1], extend[:1], heads=4, max_bytes=1)
    assert e.tolist() == [1] * 27 and p.tolist() == list(range(13, 40))


@pytest.mark.parametrize("max_bytes", [1, 6400, 1 << 30])
def test_blocked_prefill_attention_equals_the_whole(max_bytes):
    """The reference op over the query blocks gives the unblocked output (each query row sees the same keys)."""
    from poolsim.kernels.ops.extend_attention import naive
    from poolsim.kernels.standin import query_blocks

    q, k_buf, v_buf, table, rows, prefix, extend = _case()
    whole = naive.extend_attention(q, k_buf, v_buf, table, rows, prefix, extend)
    blocked = naive.extend_attention(q, k_buf, v_buf, table, *query_blocks(rows, prefix, extend, 4, max_bytes))
    torch.testing.assert_close(blocked, whole, rtol=1e-6, atol=1e-6)


def _llama_tiny_replay():
    from poolsim.kernels.replay import DeviceReplay, ReplayOptions
    from poolsim.pools.sizing.plan import plan_memory
    from tests.calibrate.util import server

    model, gpu, args = server("llama-3.1-8b", "H100", max_total_tokens=16000, context_length=4096)
    plan = plan_memory(model, gpu, args)
    return DeviceReplay(model, plan, ReplayOptions(device="cpu", tiny=True, layers="unit")), plan, args


def test_memory_estimate_by_part():
    """Llama-3.1-8B at --tiny (hidden 64, 4 q / 2 kv heads of 16, MLP 128, vocab 256, fp32 on a CPU), one layer."""
    from poolsim.kernels.replay import StepShape

    replay, plan, args = _llama_tiny_replay()
    shapes = [StepShape("extend", [100, 0], [300, 50], [], 2), StepShape("decode", [], [], [500, 20, 30], 3)]
    est = replay.memory_estimate(args, shapes)
    size, rows = plan.max_total_num_tokens, plan.max_running_requests
    width = plan.max_context_len or plan.context_len
    assert est["KV pool"] == (size + 1) * 2 * (16 + 16) * 2  # rows x kv heads x (k + v dims) x bf16, one layer
    assert est["req_to_token and its mirror"] == 2 * (rows + 1) * width * 4
    assert est["state pool"] == 0
    assert est["free lists"] == 4 * 8 * size  # the list and three int64 copies of it in the step digest
    # embed 256x64, lm_head 64x256, final norm 64, two norms 2x64, wqkv 64x(6x16 + 2x16), wo 64x64,
    # w_gu 64x256, w_d 128x64: 69,824 fp32
    assert est["stand-in weights"] == 69824 * 4
    # 4 copies of 350 tokens x 256 (w_gu) fp32, logits 2 x 3 x 256, the reference attention's fp32 k and v on
    # 4 heads x 500 context x 16, and 3 copies of the widest prefill's scores: 4 heads x 300 x 400 (under 64 MiB)
    assert est["largest step's activations"] == (4 * 350 * 256 * 4 + 2 * 3 * 256 * 4 + 2 * 4 * 500 * 16 * 4
                                                 + 3 * 4 * 4 * 300 * 400)


def test_check_memory_refuses_an_estimate_over_the_available(monkeypatch):
    from poolsim.kernels import calibrate as cal

    est = {"KV pool": 600 << 20, "req_to_token and its mirror": 500 << 20, "stand-in weights": 1 << 20}
    monkeypatch.setattr(cal, "available_bytes", lambda device: 1200 << 20)  # 0.9 x 1200 MiB < 1101 MiB
    with pytest.raises(ValueError) as e:
        cal.check_memory(est, "cpu")
    msg = str(e.value)
    assert msg.startswith("--device cpu: the replay would allocate about 1.08 GiB (KV pool 600.0 MiB, "
                          "req_to_token and its mirror 500.0 MiB, stand-in weights 1.0 MiB) but 1.17 GiB is available")
    assert "--max-total-tokens" in msg and "--layers" in msg and "shorter trace" in msg and "\n" not in msg
    monkeypatch.setattr(cal, "available_bytes", lambda device: 1300 << 20)  # 0.9 x 1300 MiB = 1170 MiB: fits
    rec = cal.check_memory(est, "cpu")
    assert rec["estimate_bytes"] == 1101 << 20 and rec["available_bytes"] == 1300 << 20
    monkeypatch.setattr(cal, "available_bytes", lambda device: None)  # unreadable: not checked
    assert cal.check_memory(est, "cpu")["available_bytes"] is None


def test_available_bytes_on_cpu_reads_memavailable():
    from poolsim.kernels import calibrate as cal

    with open("/proc/meminfo") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    assert abs(cal.available_bytes("cpu") - kb * 1024) < 2**30  # read again a moment later: within 1 GiB


def test_calibrate_refuses_before_writing_anything(tmp_path, monkeypatch):
    """Too little memory: one line, exit 2, no output folder; nothing was allocated on the device."""
    from typer.testing import CliRunner

    from poolsim.cli import app
    from poolsim.kernels import calibrate as cal
    from poolsim.kernels import replay

    monkeypatch.setattr(cal, "available_bytes", lambda device: 10 << 20)
    built = []
    monkeypatch.setattr(replay, "_Server", lambda *a, **k: built.append(a))
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"timestamp": {i * 100}, "input_length": 200, "output_length": 4, "hash_ids": [{i}]}}\n'
                             for i in range(3)))
    out = tmp_path / "cal"
    res = CliRunner().invoke(app, ["calibrate", str(trace), "--model", "llama-3.1-8b", "--gpu", "H100",
                                   "--max-total-tokens", "16000", "--context-length", "4096", "--device", "cpu",
                                   "--tiny", "--out", str(out)])
    assert res.exit_code == 2, res.output
    err = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "but 10.0 MiB is available" in err[0] and "--max-total-tokens" in err[0]
    assert not out.exists() and built == []


def test_standin_prefill_feeds_the_reference_attention_query_blocks(monkeypatch):
    """The stand-in's prefill through the reference op: with a one-block-per-row budget it passes 3 + 2 requests of
    one new token each (prefix growing by one) and its logits equal the unblocked forward's."""
    from poolsim import kernels
    from poolsim.kernels import standin
    from poolsim.kernels.replay import CpuTimer
    from poolsim.pools.model.config import ModelConfig
    from tests.calibrate.test_standin_fp8 import _forward

    model = ModelConfig.load("llama-3.1-8b")
    dims = standin.Dims.tiny(model)
    t = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
    prefill = standin.StepInputs(t([1, 2]), t([0, 0]), t([3, 2]), t([5, 6, 7, 11, 12]), t([]), t([]), t([]),
                                 None, None)
    seen, real = [], kernels.extend_attention

    def spy(q, k, v, table, rows, prefix, extend, *a, **kw):
        seen.append((rows.tolist(), prefix.tolist(), extend.tolist()))
        return real(q, k, v, table, rows, prefix, extend, *a, **kw)

    monkeypatch.setattr(kernels, "extend_attention", spy)
    whole = _forward(model, dims, [0], "float32")[0].forward(prefill, CpuTimer("cpu"))
    monkeypatch.setattr(standin, "SCORE_BLOCK_BYTES", 1)
    blocked = _forward(model, dims, [0], "float32")[0].forward(prefill, CpuTimer("cpu"))
    assert seen == [([1, 2], [0, 0], [3, 2]), ([1, 1, 1, 2, 2], [0, 1, 2, 0, 1], [1, 1, 1, 1, 1])]
    torch.testing.assert_close(blocked, whole, rtol=1e-6, atol=1e-6)


def test_output_dir_takes_back_a_killed_runs_temp_file_and_refuses_foreign_ones(tmp_path):
    from poolsim.kernels.calibrate import OutputDir

    (tmp_path / "calibration.json").write_text("{}")
    (tmp_path / ".calibration.json.tmp").write_text("half")  # what a kill between write and rename leaves
    out = OutputDir(tmp_path)
    out.write_text("calibration.json", '{"phase": "plan"}')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calibration.json"]
    (tmp_path / "notes.md").write_text("mine")
    with pytest.raises(ValueError, match=r"holds files poolsim did not write \(notes.md\)"):
        OutputDir(tmp_path)
    assert (tmp_path / "notes.md").read_text() == "mine"
