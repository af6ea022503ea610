"""poolsim calibrate / validate: the trace through torch pools and the stand-in forward on the CPU, the pool
cross-check, the fit against a synthetic timer with known coefficients, the file round trip into ``run``."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from poolsim.cli import app
from tests.calibrate.util import generate_trace

torch = pytest.importorskip("torch")

from poolsim.kernels import calibrate as cal  # noqa: E402
from poolsim.kernels.replay import DeviceReplay, PoolMismatch, ReferenceRun, ReplayOptions  # noqa: E402
from poolsim.kernels.standin import select_layers  # noqa: E402
from poolsim.pools.model.config import ModelConfig  # noqa: E402

runner = CliRunner()
SMALL = ["--max-total-tokens", "16000", "--context-length", "4096"]


@pytest.fixture(scope="module")
def chat_trace(tmp_path_factory):
    """14 short chats (prompts 30-900 tokens, 6-16 outputs): ~90 steps, a few seconds per replay."""
    return generate_trace(tmp_path_factory.mktemp("trace") / "chat.jsonl", "--sessions", "8", "--rate", "6", "--turns",
                  "uniform:1,2", "--system-prompt-len", "300", "--input-len", "uniform:30,600", "--output-len",
                  "uniform:6,16", "--think-time", "0.2")


def test_select_layers_unit_scales_each_kind():
    # Kimi-Linear: layer 0 is KDA + dense MLP; 19 more KDA + MoE layers (first: 1); 7 MLA + MoE (first: 3)
    run, scale = select_layers(ModelConfig.load("kimi-linear-48b-a3b"), "unit")
    assert run == [0, 1, 3]
    assert scale == {0: 1.0, 1: 19.0, 3: 7.0}
    run, scale = select_layers(ModelConfig.load("llama-3.1-8b"), "2")
    assert run == [0, 1] and scale == {0: 16.0, 1: 16.0}
    assert len(select_layers(ModelConfig.load("llama-3.1-8b"), "full")[0]) == 32
    with pytest.raises(ValueError, match="--layers"):
        select_layers(ModelConfig.load("llama-3.1-8b"), "zero")


# Llama-3.1-8B on an H100 (sm90), tp 1, bf16, dense, CUDA graphs for decode (<= 256) and prefill: why each
# coefficient a step replay could move is, or is not, fitted on these steps.
LLAMA_H100_FITTED = [
    "hbm_efficiency_sm90",  # decode steps are memory bound (weights + a KV read that varies per step)
    "mfu_sm90",  # prefills of 200-1,500 new tokens are compute bound
    "step_overhead_s",  # a constant on every step
]
LLAMA_H100_FIXED = {
    "moe_gemm_efficiency": "no effect",  # dense model: no routed-expert GEMM
    "graph_layer_s_sm90": "collinear",  # every step replays a graph: L x graph_layer_s is a constant per step,
    # the same column as step_overhead_s
    "eager_layer_s_sm90": "no effect",  # no eager step
    "fp8_layer_s_sm90": "no effect",  # bf16 checkpoint
    "moe_token_layer_s": "no effect",  # no MoE layer
    "linear_prefill_token_layer_s": "no effect",  # no linear-attention layer
    "link_efficiency": "no effect",  # tp 1, ep 1: no all-reduce, no all-to-all
    "allreduce_latency_s": "no effect",
    "request_cpu_s": "not part of any step's time",  # a per-request delay outside the forward passes
}


def test_fit_recovers_known_coefficients(tmp_path):
    """The fit alone on a numpy simulation's steps: long shared prompts and 10-80 token answers give decode
    steps whose KV read varies by half the weights, and prefills from 200 to 1,500 tokens."""
    from poolsim.app.run import simulate
    from poolsim.pools.hardware.gpu_catalog import ARCHS
    from poolsim.sim.step_time import Coefficients, ModelCost
    from tests.calibrate.util import load, server

    trace = generate_trace(tmp_path / "long.jsonl", "--sessions", "16", "--rate", "8", "--turns", "fixed:1",
                   "--system-prompt-len", "3000", "--input-len", "uniform:200,1500", "--output-len", "uniform:10,80")
    model, gpu, args = server("llama-3.1-8b", "H100", max_total_tokens=80000, context_length=8192)
    ref = ReferenceRun()
    res = simulate(load(trace), model, gpu, args, replay=ref)
    cost = ModelCost.from_model(model, gpu, res.plan, args)
    assert cost.arch == "sm90" and cost.prefill_cuda_graph and cost.cuda_graph_max_bs == 256
    assert cal.resolvable(cost, ref.shapes, Coefficients())[0] == LLAMA_H100_FITTED
    truth = cal.synthetic_truth(LLAMA_H100_FITTED)
    # known factors (0.8, 1.25, 1.6 in turn), the rest at the defaults
    for name, factor in zip(LLAMA_H100_FITTED, (0.8, 1.25, 1.6)):
        assert getattr(truth, name) == pytest.approx(getattr(Coefficients(), name) * factor, rel=1e-12)
    assert all(getattr(truth, n) == getattr(Coefficients(), n) for n in Coefficients.names()
               if n not in LLAMA_H100_FITTED)
    timer = cal.SyntheticTimer(cost, truth, noise=0.01, seed=0)
    measured = np.array([timer(s) for s in ref.shapes])
    held = cal.heldout_mask(len(measured))
    fit = cal.fit(cost, ref.shapes, measured, train=~held)
    assert fit.fitted == LLAMA_H100_FITTED
    assert list(fit.fixed) == [n for n in Coefficients.names() if n not in LLAMA_H100_FITTED]
    for name, why in LLAMA_H100_FIXED.items():
        assert why in fit.fixed[name], (name, fit.fixed[name])
    others = [n for n in Coefficients.names() if n.rsplit("_", 1)[-1] in ARCHS and not n.endswith("_sm90")]
    assert len(others) == 20 and all("this device's steps run on sm90" in fit.fixed[n] for n in others)
    assert all(getattr(fit.coefficients, n) == getattr(Coefficients(), n) for n in fit.fixed)
    for name in fit.fitted:
        assert abs(getattr(fit.coefficients, name) / getattr(truth, name) - 1) < 0.05, name
    # each fitted coefficient carries its standard error, and the truth lies within 3 of them (1 % timer noise)
    assert sorted(fit.rel_se) == sorted(fit.fitted) and all(0 < fit.rel_se[n] < 0.05 for n in fit.fitted)
    for name in fit.fitted:
        assert abs(np.log(getattr(fit.coefficients, name) / getattr(truth, name))) <= 3 * fit.rel_se[name], name
    pred = cal.predict(cost, fit.coefficients, ref.shapes)
    report = cal.fit_report([s.kind for s in ref.shapes], pred, measured, held)
    assert report["mape_heldout"] <= 0.04 and report["n_heldout"] == held.sum() > 0
    # a repeat run refits only what the first fitted: the rest stays at the start, with the reason
    one = cal.fit(cost, ref.shapes, measured, train=~held, only=LLAMA_H100_FITTED[:1])
    assert one.fitted == LLAMA_H100_FITTED[:1]
    assert all("not fitted by the first run" in one.fixed[n] for n in LLAMA_H100_FITTED[1:])
    assert all(getattr(one.coefficients, n) == getattr(Coefficients(), n) for n in LLAMA_H100_FITTED[1:])


def test_identifiable_drops_nil_and_collinear_columns():
    """Hand-made sensitivities: b is nil (1e-4 < SENSITIVITY_MIN on every step), c = a + 2 d."""
    a = np.array([1.0, 0.0, 1.0, 0.0])
    d = np.array([0.0, 0.5, 0.0, 0.6])
    J = np.stack([a, np.full(4, 1e-4), a + 2 * d, d], axis=1)
    fitted, fixed = cal.identifiable(J, ["a", "b", "c", "d"])
    # pivoted: c (norm 2.1) first; then what is left of a is -2x what is left of d, so a is taken; d = (c - a) / 2
    # has nothing of its own left: collinear
    assert fitted == ["a", "c"]
    assert set(fixed) == {"b", "d"} and "no effect" in fixed["b"] and "collinear" in fixed["d"]


def test_heldout_blocks_are_contiguous():
    m = cal.heldout_mask(16)  # 8 blocks of 2: blocks 2 and 6 are steps 4-5 and 12-13
    assert np.flatnonzero(m).tolist() == [4, 5, 12, 13]


def test_calibrate_tiny_end_to_end(chat_trace, tmp_path):
    out = tmp_path / "cal"
    args = ["--model", "kimi-linear-48b-a3b", "--gpu", "H200", *SMALL]
    res = runner.invoke(app, ["calibrate", str(chat_trace), *args, "--device", "cpu", "--tiny", "--out", str(out),
                              "--repeat", "2"])
    assert res.exit_code == 0, res.output
    rec = json.loads((out / "calibration.json").read_text())
    assert rec["phase"] == "done" and rec["fixture_only"] is True
    # the second run (the synthetic timer's noise drawn again) agrees with the first within 3 %
    rep = rec["repeat"]
    assert rep["runs"] == 2 and rep["agree"] is True and rep["max_rel_diff"] <= 0.03
    assert sorted(rep["each"][0]["compared"]) == ["fitted decode total", "fitted prefill total",
                                                  "median decode step", "median prefill step"]
    assert sorted(rep["each"][0]["coefficients"]) == sorted(rec["fit"]["fitted"])
    assert "two runs agree: yes" in res.output
    assert rec["pool_check"]["mismatches"] == 0
    # the up-front memory check passed: its estimate, by part, and what the host had
    mem = rec["memory"]
    assert mem["estimate_bytes"] == sum(mem["parts_bytes"].values()) <= 0.9 * mem["available_bytes"]
    assert mem["parts_bytes"]["state pool"] > 0 and mem["parts_bytes"]["KV pool"] > 0
    assert rec["pool_check"]["steps"] == rec["replay"]["steps"] == rec["fit"]["n"] > 40  # 42 at the shipped defaults
    assert rec["pool_check"]["triton_steps"] == 3 and rec["pool_check"]["guard_slots"] == "untouched"
    assert rec["layers"]["run"] == [0, 1, 3]
    for key in ("device", "date", "commit", "model", "server_args", "coefficients", "wall_s"):
        assert rec[key] is not None, key
    assert rec["device"]["torch"] == torch.__version__
    # Kimi-Linear on an H200 (sm90), tp 1, bf16: decode steps replay graphs, prefills run eager (KDA turns prefill
    # graphs off); why each coefficient a step replay could move is, or is not, fitted on these ~40 training steps
    fit = rec["fit"]
    assert fit["arch"] == "sm90" and fit["fitted"] == [
        "hbm_efficiency_sm90",  # decode steps are memory bound
        "mfu_sm90",  # the few prefills are compute bound at the refit step overhead (3.2 ms, tpot12)
        "eager_layer_s_sm90",  # a constant on prefill steps only
        "step_overhead_s",  # a constant on every step
        "linear_prefill_token_layer_s",  # the KDA scan per prefill token
    ]
    fixed = {n: why for n, why in fit["fixed"].items() if not n.endswith(("_sm80", "_sm89", "_sm100", "_gfx942"))}
    assert {n: why.split(" ")[0] for n, why in fixed.items()} == {
        "moe_gemm_efficiency": "collinear",  # the expert share of a prefill's flops is the same on every prefill
        # (attention pairs are a negligible part at these lengths): moves predictions only as mfu_sm90 does
        "graph_layer_s_sm90": "collinear",  # a constant on decode steps = step_overhead_s less the eager constant
        "fp8_layer_s_sm90": "no",  # bf16 checkpoint: no effect
        "moe_token_layer_s": "no",  # 1e-10 s per token and layer: < 0.01 % of any step
        "triton_decode_token_layer_s": "no", "triton_decode_kv_token_layer_s": "no",  # H200: not the Triton backend
        "link_efficiency": "no", "allreduce_latency_s": "no",  # tp 1, ep 1
        "request_cpu_s": "a",  # a per-request delay, not step time
    }
    assert len(fit["fixed"]) - len(fixed) == 20  # the other architectures' coefficients
    # the file speaks only for sm90 and the architecture-independent step terms (request_cpu_s: not measured)
    assert list(rec["coefficients"]) == ["hbm_efficiency_sm90", "mfu_sm90", "moe_gemm_efficiency",
                                         "graph_layer_s_sm90", "eager_layer_s_sm90", "fp8_layer_s_sm90",
                                         "step_overhead_s", "moe_token_layer_s", "linear_prefill_token_layer_s",
                                         "triton_decode_token_layer_s", "triton_decode_kv_token_layer_s",
                                         "link_efficiency", "allreduce_latency_s"]
    truth = rec["synthetic_timer"]["coefficients"]
    assert truth["eager_layer_s_sm90"] == pytest.approx(150e-6 * 1.6)  # third resolvable: factor 1.6
    assert truth["linear_prefill_token_layer_s"] == pytest.approx(1e-6 / 1.4)  # x1.4 leaves the bounds: / 1.4
    assert truth["graph_layer_s_sm90"] == 20e-6  # not resolvable here: not moved
    assert sorted(fit["recovery"]) == sorted(fit["fitted"]) and fit["at_bound"] == []
    # the KDA scan shares the few prefill steps with mfu_sm90 (fitted since the tpot12 refit): recovered within 8 %
    assert all(abs(err) < (0.08 if n == "linear_prefill_token_layer_s" else 0.05)
               for n, err in fit["recovery"].items()), sorted(fit["recovery"].items())
    assert rec["fit"]["mape_heldout"] <= 0.04 < rec["fit"]["before"]["mape_heldout"]
    steps = (out / "steps.csv").read_text().splitlines()
    assert steps[0].startswith("step,kind,batch_size") and len(steps) == rec["replay"]["measured"] + 1
    # the replayed schedule is `poolsim run`'s, byte for byte
    run_dir = tmp_path / "run"
    res = runner.invoke(app, ["run", str(chat_trace), *args, "--quiet", "--out", str(run_dir)])
    assert res.exit_code == 0, res.output
    assert (out / "replay_steps.csv").read_bytes() == (run_dir / "steps.csv").read_bytes()
    # the file round trip: run uses the fitted coefficients and says where they came from
    res = runner.invoke(app, ["run", str(chat_trace), *args, "--quiet", "--calibration", str(out / "calibration.json"),
                              "--out", str(tmp_path / "run2")])
    assert res.exit_code == 0, res.output
    assert "step time calibrated from" in res.output and "CPU test fixture" in res.output
    run2 = json.loads((tmp_path / "run2" / "run.json").read_text())
    # the time-model line names the file, the device and the date, and uses the fitted coefficients
    assert (f"calibration {out / 'calibration.json'} (cpu, {rec['date']}); held-out step MAPE "
            f"{fit['mape_heldout']:.1%}") in run2["step_time_model"]
    assert f"time model: {run2['step_time_model']}" in res.output
    k = rec["coefficients"]
    assert (f"sm90 MFU {k['mfu_sm90']:g}, HBM efficiency {k['hbm_efficiency_sm90']:g}, "
            f"{k['graph_layer_s_sm90'] * 1e6:g}/{k['eager_layer_s_sm90'] * 1e6:g} us per layer (graph/eager), "
            f"{k['step_overhead_s'] * 1e3:g} ms per step") in run2["step_time_model"]
    # validate: predicted (the file's coefficients) vs measured, without refitting
    res = runner.invoke(app, ["validate", str(chat_trace), *args, "--calibration", str(out / "calibration.json"),
                              "--device", "cpu", "--tiny", "--max-steps", "6", "--triton-steps", "0"])
    assert res.exit_code == 0, res.output
    assert "end to end: predicted" in res.output and "decode" in res.output


def test_first_pool_mismatch_stops_the_run_naming_step_and_pool(chat_trace):
    from poolsim.app.run import simulate
    from poolsim.pools.sizing.plan import plan_memory
    from tests.calibrate.util import load, server

    model, gpu, args = server("llama-3.1-8b", "H100", max_total_tokens=16000, context_length=4096)
    ref = ReferenceRun()
    simulate(load(chat_trace), model, gpu, args, replay=ref)
    ref.digests[7]["KV allocator free list"] = "corrupted"
    replay = DeviceReplay(model, plan_memory(model, gpu, args), ReplayOptions(device="cpu", tiny=True, max_steps=0),
                          reference=ref.digests)
    with pytest.raises(PoolMismatch, match="step 7: KV allocator free list differs") as e:
        simulate(load(chat_trace), model, gpu, args, replay=replay)
    assert e.value.step == 7 and e.value.pool == "KV allocator free list" and replay.pool_checked == 7


def test_out_folder_with_foreign_files_is_refused(chat_trace, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    res = runner.invoke(app, ["calibrate", str(chat_trace), "--model", "llama-3.1-8b", "--gpu", "H100", *SMALL,
                              "--device", "cpu", "--tiny", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "poolsim did not write (notes.txt)" in res.output
    assert (tmp_path / "notes.txt").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_bad_layers_and_missing_cuda_are_one_line_errors(chat_trace, tmp_path):
    base = ["calibrate", str(chat_trace), "--model", "llama-3.1-8b", "--gpu", "H100", *SMALL, "--out", str(tmp_path / "x")]
    res = runner.invoke(app, base + ["--device", "cpu", "--tiny", "--layers", "0"])
    assert res.exit_code == 2 and "--layers '0'" in res.output
    if not torch.cuda.is_available():
        res = runner.invoke(app, base + ["--device", "cuda:0"])
        assert res.exit_code == 2 and "no CUDA device" in res.output
    assert not (tmp_path / "x").exists()


def test_running_out_of_memory_is_not_blamed_on_the_simulated_server(chat_trace, tmp_path, monkeypatch):
    """A host allocation failure (torch's CPU allocator) is the replay's own memory, not SGLang's behaviour: one
    line saying what to shrink, exit code 2."""
    def oom(*a, **k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                           "memory: you tried to allocate 3493199872 bytes.\nmore")
    monkeypatch.setattr(cal, "calibrate", oom)
    res = runner.invoke(app, ["calibrate", str(chat_trace), "--model", "llama-3.1-8b", "--gpu", "H100", *SMALL,
                              "--device", "cpu", "--tiny", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2
    assert res.output.startswith("error: --device cpu: the replay ran out of memory ([enforce fail")
    assert "3493199872 bytes.)" in res.output and "--max-total-tokens" in res.output
    assert "simulated SGLang server" not in res.output and res.output.count("\n") == 1


@pytest.mark.gpu
@pytest.mark.parametrize("model, extra", [("kimi-linear-48b-a3b", []), ("qwen3-next-80b-a3b", ["--tp", "2"]),
                                          ("nemotron-3-nano-30b-a3b", []), ("llama-3.1-8b", [])])
def test_calibrate_on_cuda_tiny(chat_trace, tmp_path, model, extra):
    """Requires CUDA: decode steps replay CUDA graphs captured per bucket, the pools still match every step."""
    if not torch.cuda.is_available():
        pytest.skip("requires CUDA")
    out = tmp_path / "gpu"
    res = runner.invoke(app, ["calibrate", str(chat_trace), "--model", model, "--gpu", "H200", *extra, *SMALL,
                              "--device", "cuda:0", "--tiny", "--repeat", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rec = json.loads((out / "calibration.json").read_text())
    assert rec["pool_check"]["mismatches"] == 0 and rec["device"]["sm_count"] > 0
    assert rec["pool_check"]["guard_slots"] == "untouched"
    graphs = rec["replay"]["graphs"]
    assert graphs["mode"] == "cuda graphs" and graphs["captured"] and graphs["capture_s"] > 0
    assert set(map(str, graphs["captured"])) == set(graphs["decode_steps_per_bucket"])
    assert rec["repeat"]["each"][0]["measured"] == rec["replay"]["measured"]
