"""The analytic step-time model: its documented formula worked by hand, its limits, calibration files."""

import json
from dataclasses import replace

import pytest

from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.plan import plan_memory
from poolsim.pools.sizing.server_args import ServerArgs
from poolsim.sim.schedule_batch import ScheduleBatch
from poolsim.sim.step_time import (
    FIT_BOUNDS,
    MEASURED_ERROR,
    AnalyticStepTime,
    Coefficients,
    FixedStepTime,
    ModelCost,
    calibration_source,
)


def cost(name="llama-3.1-8b", gpu="H100", args=None, **flags):
    model, card = ModelConfig.load(name), get_gpu(gpu)
    server_args = args or ServerArgs(**flags)
    return ModelCost.from_model(model, card, plan_memory(model, card, server_args), args)


def decode_batch(seq_lens):
    b = ScheduleBatch([object()] * len(seq_lens), None, None, "decode")
    b.decode_seq_lens_sum, b.num_decode_reqs = sum(seq_lens), len(seq_lens)
    return b


def prefill_batch(prefix_lens, extend_lens):
    b = ScheduleBatch([object()] * len(extend_lens), None, None, "extend")
    b.prefix_lens, b.extend_lens = list(prefix_lens), list(extend_lens)
    return b


# Round coefficients so every expectation below is worked by hand, independent of the fitted defaults.
K = Coefficients(hbm_efficiency_sm90=0.75, mfu_sm90=0.5, graph_layer_s_sm90=20e-6, eager_layer_s_sm90=150e-6,
                 step_overhead_s=1e-3, moe_token_layer_s=10e-9, linear_prefill_token_layer_s=30e-9,
                 moe_gemm_efficiency=0.5, link_efficiency=0.8, allreduce_latency_s=8e-6)


def test_llama_8b_single_decode_is_bandwidth_bound_by_hand():
    c = cost()
    # Llama-3.1-8B: 8,030,261,248 bf16 parameters = 16,060,522,496 B read per step; KV cell
    # 8 heads x (128 + 128) x 32 layers x 2 B = 131,072 B/token, read for 1000 context tokens, written for 1.
    assert c.dense_weight_bytes == 16_060_522_496 and c.expert_weight_bytes == 0
    assert c.kv_cell_bytes == 131_072
    nbytes = 16_060_522_496 + 131_072 * (1000 + 1)
    memory_s = nbytes / (3.35e12 * 0.75)  # H100 SXM HBM3 3.35 TB/s x hbm_efficiency_sm90
    t = AnalyticStepTime(c, K)(decode_batch([1000]))
    # + 32 layers x 20 us (batch 1 replays a CUDA graph) + 1 ms per step; compute is far below memory
    assert t == pytest.approx(memory_s + 32 * 20e-6 + 1e-3, rel=1e-12)


def test_decode_above_cuda_graph_max_bs_runs_eager():
    c = cost(args=ServerArgs())
    # H100 (80 GiB tier), tp 1: decode graphs up to bs 256 (memory_hook.py:134-141)
    assert c.cuda_graph_max_bs == 256
    assert cost(args=ServerArgs(max_running_requests=64)).cuda_graph_max_bs == 64
    assert cost(args=ServerArgs(disable_cuda_graph=True)).cuda_graph_max_bs == 0
    model = AnalyticStepTime(c, K)
    graph, eager = model(decode_batch([100] * 256)), model(decode_batch([100] * 257))
    # one more request adds its KV bytes and flops, and the step loses the graph: 32 x (150 - 20) us
    one_more = model.time_of(0, 257, 0, 257 * 100, 257 * 100, 257) - model.time_of(0, 256, 0, 256 * 100,
                                                                                     256 * 100, 256)
    assert one_more > 32 * 130e-6 and eager - graph == pytest.approx(one_more, rel=1e-12)


def test_prefill_graph_follows_sglang_defaults():
    # breakable prefill graphs are on for CUDA models (cuda_graph_config.py:119) but not for KDA
    # models (cuda_graph_hook.py:160-170), nor on AMD, nor with --disable-cuda-graph
    assert cost(args=ServerArgs()).prefill_cuda_graph
    assert not cost("kimi-linear-48b-a3b", "H200", args=ServerArgs()).prefill_cuda_graph
    assert not cost(gpu="MI300X", args=ServerArgs()).prefill_cuda_graph
    assert not cost(args=ServerArgs(disable_cuda_graph=True)).prefill_cuda_graph
    eager = AnalyticStepTime(cost(), K)  # without ServerArgs: prefill eager
    graph = AnalyticStepTime(cost(args=ServerArgs()), K)
    assert eager(prefill_batch([0], [512])) - graph(prefill_batch([0], [512])) == pytest.approx(32 * 130e-6)


def test_large_prefill_is_compute_bound():
    c = cost()
    model = AnalyticStepTime(c, K)
    t = model(prefill_batch([0], [8192]))
    # GEMMs alone: 2 x active params x 8192 tokens at 50 % of 989.5 TFLOP/s
    gemm_s = 2 * c.active_params * 8192 / (989.5e12 * 0.5)
    assert t > gemm_s and t < 2 * gemm_s


def test_efficiency_is_per_gpu_architecture():
    b200 = AnalyticStepTime(cost(gpu="B200"), replace(K, hbm_efficiency_sm100=0.4, graph_layer_s_sm100=20e-6))
    c = b200.cost
    assert c.arch == "sm100"
    nbytes = c.dense_weight_bytes + c.kv_cell_bytes * 11
    assert b200(decode_batch([10])) == pytest.approx(nbytes / (8e12 * 0.4) + 32 * 20e-6 + 1e-3, rel=1e-12)


def test_time_grows_with_work_and_is_deterministic():
    model = AnalyticStepTime(cost(), K)
    assert model(decode_batch([1000] * 64)) > model(decode_batch([1000] * 8)) > model(decode_batch([1000]))
    assert model(decode_batch([4000] * 8)) > model(decode_batch([1000] * 8))
    assert model(prefill_batch([0], [4096])) == model(prefill_batch([0], [4096]))


def test_kda_state_traffic_counts_per_request():
    c = cost("kimi-linear-48b-a3b", "H200")
    assert c.state_bytes == 43_417_600  # one request's KDA state (docs/sglang.md 7.3)
    model = AnalyticStepTime(c, K)
    extra = model(decode_batch([10] * 65)) - model(decode_batch([10] * 64))
    # one more request reads and writes its 41.4 MiB state: >= 2 x 43.4 MB at 75 % of 4.8 TB/s = 24 us
    assert extra >= 2 * 43_417_600 / (4.8e12 * 0.75)


def test_linear_attention_prefill_cost_per_token_and_layer():
    c = cost("kimi-linear-48b-a3b", "H200")
    assert (c.num_layers, c.num_linear_layers, c.num_moe_layers) == (27, 20, 26)
    base = AnalyticStepTime(c, K)(prefill_batch([0], [4096]))
    more = AnalyticStepTime(c, replace(K, linear_prefill_token_layer_s=40e-9))(prefill_batch([0], [4096]))
    assert more - base == pytest.approx(20 * 4096 * 10e-9, rel=1e-9)  # 20 KDA layers x 4096 tokens x 10 ns
    # decode pays no chunked-prefill cost
    d1 = AnalyticStepTime(c, K)(decode_batch([100] * 8))
    assert d1 == AnalyticStepTime(c, replace(K, linear_prefill_token_layer_s=40e-9))(decode_batch([100] * 8))


def test_moe_reads_only_the_experts_a_small_batch_touches():
    c = cost("qwen3-30b-a3b", "H100")
    assert c.num_experts == 128 and c.top_k == 8 and c.expert_weight_bytes > c.dense_weight_bytes
    model = AnalyticStepTime(c, K)
    assert model(decode_batch([100])) < model(decode_batch([100] * 64))


def test_moe_routing_and_expert_parallel_all_to_all():
    c = cost("qwen3-30b-a3b", "H100")
    assert c.num_moe_layers == 48 and c.ep == 1
    base = AnalyticStepTime(c, K)(decode_batch([100] * 32))
    routed = AnalyticStepTime(c, replace(K, moe_token_layer_s=20e-9))(decode_batch([100] * 32))
    assert routed - base == pytest.approx(48 * 32 * 10e-9, rel=1e-9)  # 48 MoE layers x 32 tokens x 10 ns
    ep = AnalyticStepTime(replace(c, ep=8), K)(decode_batch([100] * 32))
    # dispatch + combine per MoE layer: 32 tokens x top-8 x 2048 hidden x 2 B x 7/8 over 450 GB/s x 0.8
    a2a = 2 * 48 * (32 * 8 * 2048 * 2 * 7 / 8) / (450e9 * 0.8)
    assert ep - base == pytest.approx(a2a, rel=1e-9)


def test_tp_adds_all_reduce_time_over_the_gpus_link():
    one = AnalyticStepTime(cost("llama-3.1-70b", "H100", tp_size=8), K)
    assert one.cost.tp == 8
    # 80 layers x 2 all-reduces, each 2 x 7/8 x (1 token x 8192 x 2 B) / (450 GB/s x 0.8) + 8 us latency
    per = 2 * 7 / 8 * 8192 * 2 / (450e9 * 0.8) + 8e-6
    c = one.cost
    nbytes = c.dense_weight_bytes + c.kv_cell_bytes * (100 + 1)
    expected = nbytes / (3.35e12 * 0.75) + 160 * per + 80 * 20e-6 + 1e-3
    assert one(decode_batch([100])) == pytest.approx(expected, rel=1e-9)
    b200 = cost("llama-3.1-70b", "B200", tp_size=8)
    assert b200.link_bandwidth == 900e9  # NVLink 5


def test_defaults_lie_inside_their_fit_bounds():
    k = Coefficients()
    assert set(FIT_BOUNDS) == set(Coefficients.names())
    for name, (lo, hi) in FIT_BOUNDS.items():
        assert 0 < lo <= getattr(k, name) <= hi, name


def test_calibration_file_replaces_coefficients(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"device": "NVIDIA H100", "date": "2026-11-29",
                                "coefficients": {"hbm_efficiency_sm90": 0.9, "step_overhead_s": 0.002}}))
    k = Coefficients.from_calibration(path)
    assert (k.hbm_efficiency_sm90, k.step_overhead_s, k.mfu_sm90) == (0.9, 0.002, Coefficients().mfu_sm90)
    assert calibration_source(path) == (f"calibration {path} (NVIDIA H100, 2026-11-29); "
                                        "its error against published runs: not measured")
    # `poolsim calibrate` records the device as a dict (name, torch id, versions) and its own measured error
    path.write_text(json.dumps({"device": {"device": "cuda:0", "name": "NVIDIA H200", "sm_count": 132},
                                "date": "2026-12-01T03:00:00+00:00", "coefficients": {},
                                "measured_error": "held-out step MAPE 6.0% over 9 replayed steps"}))
    assert calibration_source(path) == (f"calibration {path} (NVIDIA H200 cuda:0, 2026-12-01T03:00:00+00:00); "
                                        "held-out step MAPE 6.0% over 9 replayed steps")
    path.write_text(json.dumps({"device": {"device": "cpu", "name": "cpu"}, "coefficients": {}}))
    assert calibration_source(path) == f"calibration {path} (cpu); its error against published runs: not measured"
    path.write_text(json.dumps({"coefficients": {"warp_speed": 9}}))
    with pytest.raises(ValueError, match="unknown coefficient"):
        Coefficients.from_calibration(path)
    path.write_text(json.dumps({"coefficients": {"mfu_sm90": -1}}))
    with pytest.raises(ValueError, match="positive"):
        Coefficients.from_calibration(path)
    path.write_text(json.dumps({"coefficients": {"mfu_sm90": True}}))
    with pytest.raises(ValueError, match="positive"):
        Coefficients.from_calibration(path)
    for text in ('{"coefficients": {"mfu_sm90": NaN}}', '{"coefficients": {"step_overhead_s": Infinity}}'):
        path.write_text(text)  # Python's json reads both; a run on them would print "duration nan s" and FITS
        with pytest.raises(ValueError, match=f"{path}: coefficient.*must be finite positive numbers"):
            Coefficients.from_calibration(path)
    path.write_text(json.dumps({"coefficients": {"hbm_efficiency_sm90": 1e300}}))
    with pytest.raises(ValueError, match="hbm_efficiency_sm90 = 1e.300: must be a fraction of the datasheet peak"):
        Coefficients.from_calibration(path)
    path.write_text(json.dumps({"coefficients": {"step_overhead_s": 2.0}}))
    with pytest.raises(ValueError, match="step_overhead_s = 2: must be seconds, under 1"):
        Coefficients.from_calibration(path)
    path.write_text("not json")
    with pytest.raises(ValueError, match="not a poolsim calibration file"):
        Coefficients.from_calibration(path)


def test_fixed_step_time_rejects_nonsense():
    assert FixedStepTime(0.02)(None) == 0.02
    with pytest.raises(ValueError):
        FixedStepTime(0)


def test_fp8_layers_add_their_activation_quantization_cost():
    c = cost("deepseek-v3", "B200", tp_size=8)
    assert c.fp8 and c.num_layers == 61 and not cost().fp8
    base = AnalyticStepTime(c, replace(K, fp8_layer_s_sm100=10e-6))(decode_batch([100]))
    more = AnalyticStepTime(c, replace(K, fp8_layer_s_sm100=30e-6))(decode_batch([100]))
    assert more - base == pytest.approx(61 * 20e-6, rel=1e-9)  # 61 layers x 20 us


def test_calibration_of_another_architecture_quotes_the_defaults_error(tmp_path):
    """A calibration fitted on an H100 (sm90) moves no B200 (sm100) coefficient: a B200 run must not quote the H100
    file's step error as its own."""
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"device": {"device": "cuda:0", "name": "NVIDIA H100"}, "date": "2026-12-01",
                                "coefficients": {"hbm_efficiency_sm90": 0.7}, "fit": {"arch": "sm90"},
                                "measured_error": "held-out step MAPE 4.0% over 9 replayed steps"}))
    head = f"calibration {path} (NVIDIA H100 cuda:0, 2026-12-01); "
    assert calibration_source(path, "sm90") == head + "held-out step MAPE 4.0% over 9 replayed steps"
    assert calibration_source(path, "sm100") == (head + "fitted on sm90: this sm100 GPU keeps the fitted defaults "
                                                 f"of its architecture ({MEASURED_ERROR})")


def test_readme_quotes_the_shipped_time_model_error():
    """README.md's time-model paragraph quotes MEASURED_ERROR (what `run` prints), not an older fit's figures:
    it quoted 41 runs and 7 % / 24 % / 8 % after the defaults were refitted to 16 % / 23 % / 18 %."""
    import re
    from pathlib import Path
    tput, ttft, ttft50, tpot = re.match(r"held-out median \|error\| (\d+)% throughput, (\d+)% TTFT "
                                        r"\(median TTFT (\d+)%\), (\d+)% TPOT", MEASURED_ERROR).groups()
    held_out = re.search(r"of (\d+) held-out published", MEASURED_ERROR).group(1)
    signed = re.search(r"median signed error ([-+]\d+)% throughput, ([-+]\d+)% mean TTFT, ([-+]\d+)% median TTFT, "
                       r"([-+]\d+)% TPOT$", MEASURED_ERROR).groups()
    readme = " ".join((Path(__file__).parents[2] / "README.md").read_text().split())
    assert (f"on the {held_out} held-out published runs" in readme
            and f"its median error is {tput} % on output throughput, {ttft} % on mean TTFT ({ttft50} % on median "
                f"TTFT) and {tpot} % on TPOT" in readme
            and "(median signed error): {} % on throughput, {} % on mean TTFT, {} % on median TTFT, {} % on TPOT"
                .format(*signed) in readme)


def test_a_calibration_stopped_before_its_fit_is_named_as_such(tmp_path):
    """calibrate rewrites calibration.json after each phase; one killed before the fit has no coefficients, and
    `run --calibration` says that rather than 'not a poolsim calibration file'."""
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"format": "poolsim-calibration/1", "phase": "reference", "device": {}}))
    with pytest.raises(ValueError, match=r"cal.json: a calibration that stopped at its 'reference' phase, before "
                                         r"the fit: no coefficients \(run calibrate again\)$"):
        Coefficients.from_calibration(path)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a poolsim calibration file"):
        Coefficients.from_calibration(path)


def test_triton_decode_attention_costs_the_mean_sequence_length_per_full_attention_layer():
    c = cost("glm-4.7-flash", "B200", attention_backend="triton")
    assert c.triton_decode and c.num_full_attention_layers == 47
    assert not cost("glm-4.7-flash", "B200").triton_decode  # SGLang's default backend there is not Triton
    slow = replace(K, triton_decode_token_layer_s=30e-9)
    base = AnalyticStepTime(c, replace(K, triton_decode_token_layer_s=10e-9))
    # decode: 47 MLA layers x mean length (1,000 + 3,000) / 2 = 2,000 tokens x 20 ns
    assert AnalyticStepTime(c, slow)(decode_batch([1000, 3000])) - base(decode_batch([1000, 3000])) \
        == pytest.approx(47 * 2000 * 20e-9, rel=1e-9)
    # a prefill step pays none of it, nor does another backend
    assert AnalyticStepTime(c, slow)(prefill_batch([0], [512])) == base(prefill_batch([0], [512]))
    other = replace(c, triton_decode=False)
    assert AnalyticStepTime(other, slow)(decode_batch([1000, 3000])) == AnalyticStepTime(other, K)(
        decode_batch([1000, 3000]))
    # a full batch: the kernel's rate on the batch's KV tokens, 47 layers x (1,000 + 3,000) tokens x 1 ns
    kv = AnalyticStepTime(c, replace(K, triton_decode_kv_token_layer_s=2e-9))(decode_batch([1000, 3000]))
    assert kv - AnalyticStepTime(c, replace(K, triton_decode_kv_token_layer_s=1e-9))(decode_batch([1000, 3000])) \
        == pytest.approx(47 * 4000 * 1e-9, rel=1e-9)


def test_prior_only_note_names_an_architecture_whose_terms_were_not_fitted():
    from poolsim.sim.step_time import DEFAULTS, PRIORS, prior_only_note
    sm90 = [n for n in DEFAULTS if n.endswith("_sm90")]
    assert sm90 and all(DEFAULTS[n] == PRIORS[n] for n in sm90)  # no fitted published run on H100/H200
    assert prior_only_note("sm90") == ("; the sm90 terms are priors: no published run on sm90 was fitted "
                                       "(a calibration file replaces them)")
    assert DEFAULTS["hbm_efficiency_sm100"] != PRIORS["hbm_efficiency_sm100"]  # B200 runs were fitted
    assert prior_only_note("sm100") == "" and prior_only_note(None) == ""
