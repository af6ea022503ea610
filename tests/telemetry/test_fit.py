"""calibrate --measured and validate --measured as library calls: a stream from a known roofline is recovered, the
file is the calibration format `run --calibration` reads, and validate reports what the issue asks."""

import json
import math

import numpy as np
import pytest

from poolsim.kernels import calibrate as cal
from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.server_args import ServerArgs
from poolsim.sim import step_time
from poolsim.telemetry import load_measured, read_bench_results, read_fpm, read_server_log
from poolsim.telemetry.fit import calibrate_measured, cost_of
from poolsim.telemetry.synthetic import synthetic_stream, write_jsonl
from poolsim.telemetry.validate import bench_config, validate_runs, validate_steps
from poolsim.traces.bench_serving import bench_requests
from tests.telemetry.samples import bench_result, decode_0523, write_lines

MODEL, GPU = ModelConfig.load("llama-3.1-8b"), get_gpu("h200")
ARGS = ServerArgs()


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    """~1,000 steps of 60 random-ids requests at 6 req/s, timed by the model at known coefficients, 3 % noise."""
    trace = bench_requests("random-ids", 60, input_len=2048, output_len=64, range_ratio=0.1, request_rate=6.0,
                           vocab_size=MODEL.vocab_size, seed=1)
    flat = synthetic_stream(trace, MODEL, GPU, ARGS, step_time.Coefficients(), noise=0.0)
    path = tmp_path_factory.mktemp("fpm") / "flat.jsonl"
    write_jsonl(flat, path)
    cost, _ = cost_of(MODEL, GPU, ARGS)
    truth = cal.synthetic_truth(cal.resolvable(cost, read_fpm(path).steps, step_time.Coefficients())[0])
    path = path.with_name("noisy.jsonl")
    write_jsonl(synthetic_stream(trace, MODEL, GPU, ARGS, truth, noise=0.03, seed=7), path)
    return path, truth


def test_calibrate_measured_recovers_a_known_roofline(stream, tmp_path):
    path, truth = stream
    rec = calibrate_measured([read_fpm(path)], MODEL, GPU, ARGS, out=tmp_path / "cal", log=lambda *_: None)
    f = rec["fit"]
    # decode steps are memory bound with a KV read that varies, prefills compute bound, a constant on every step
    assert set(f["fitted"]) == {"hbm_efficiency_sm90", "mfu_sm90", "step_overhead_s"}
    for n in f["fitted"]:
        se = f["rel_se"][n]
        assert 0 < se < 0.1 and rec["standard_error"][n] == pytest.approx(se * rec["coefficients"][n])
        assert rec["coefficients"][n] == pytest.approx(getattr(truth, n), rel=3 * se)
    assert f["heldout_error_pct"]["median_abs"] < 5.0  # the noise is 3 %
    assert f["n_heldout"] > 100 and f["heldout"] == "blocks 2, 6 of 8 contiguous blocks"
    assert "collinear" in rec["kept_defaults"]["graph_layer_s_sm90"]  # every step replays a graph
    assert "no effect" in rec["kept_defaults"]["moe_gemm_efficiency"]
    assert "request_cpu_s" not in rec["coefficients"]
    assert rec["skipped"] == {"idle heartbeat (all zeros, wall_time 0)": 1}
    # the file is the one `--calibration` reads
    written = tmp_path / "cal" / "calibration.json"
    k = step_time.Coefficients.from_calibration(written)
    assert k.hbm_efficiency_sm90 == rec["coefficients"]["hbm_efficiency_sm90"]
    assert "SGLang server telemetry" in step_time.calibration_source(written, "sm90")
    assert {p.name for p in (tmp_path / "cal").iterdir()} == {"calibration.json", "steps.csv", "report.md",
                                                              "calibration.png"}
    # validate with it: the errors are the noise's
    v = validate_steps([read_fpm(path)], MODEL, GPU, ARGS, calibration=written)
    assert v["steps"] == len(read_fpm(path).steps) and v["skipped"] == rec["skipped"]
    assert v["step_time_error_pct"]["median_abs"] < 3.0 and abs(v["step_time_error_pct"]["median_signed"]) < 1.0
    assert set(v["by_kind"]) == {"decode", "prefill", "mixed"} and v["by_kind"]["mixed"]["steps"] == 0
    assert v["by_kind"]["decode"]["steps"] > v["by_kind"]["prefill"]["steps"] > 0
    json.dumps(v)


def test_calibrate_measured_fits_nothing_from_marked_steps_only(tmp_path):
    log = read_server_log(write_lines(tmp_path / "s.log", [decode_0523(10, 8, 9000, 800.0, queue=3)]))
    with pytest.raises(ValueError, match=r"no usable measured step .*server-log: first interval, saturated"):
        calibrate_measured([log], MODEL, GPU, ARGS, log=lambda *_: None)


def test_validate_compares_log_sizes_and_graph_flags(tmp_path):
    plan = cost_of(MODEL, GPU, ARGS)[1]
    lines = [f"[2026-11-02 10:15:02 TP0] max_total_num_tokens={plan.max_total_num_tokens}, chunked_prefill_size="
             f"{plan.chunked_prefill_size}, max_prefill_tokens=16384, max_running_requests="
             f"{plan.max_running_requests}, context_len={plan.context_len}, available_gpu_mem=10.51 GB",
             decode_0523(10, 8, 9000, 800.0), decode_0523(11, 8, 9320, 790.0)]
    steps, _ = load_measured([write_lines(tmp_path / "s.log", lines)])
    v = validate_steps(steps, MODEL, GPU, ARGS)
    assert v["sizes"][0]["equal"] and v["sizes"][0]["max_total_num_tokens"]["log"] == plan.max_total_num_tokens
    assert v["cuda_graph"] == {"lines": 1, "disagree": 0, "first_disagreement": None,
                               "poolsim_cuda_graph_max_bs": 256}
    assert v["steps"] == 1 and v["skipped"] == {"server-log: first interval": 1}


def test_bench_config_from_a_result_says_what_it_assumed(tmp_path):
    plain, detailed, trace, image = read_bench_results(write_lines(tmp_path / "b.jsonl", [
        bench_result(), bench_result(details=True, errors=[""] * 7 + ["timeout"]),
        bench_result(request_rate="trace"), bench_result(dataset_name="image")]))
    cfg, assumed = bench_config(plain, seed=None)
    assert (cfg.num_prompts, cfg.random_input_len, cfg.random_output_len, cfg.max_concurrency) == (8, 256, 32, 4)
    assert math.isinf(cfg.request_rate) and cfg.seed == 42 and "default" in assumed["seed_from"]
    cfg, assumed = bench_config(detailed, seed=5)
    assert cfg.seed == 5 and cfg.num_prompts == 7 and "1 failed requests left out" in assumed["lengths"]
    assert bench_config(trace, seed=None)[0] is None and bench_config(image, seed=None)[0] is None


def test_validate_runs_replays_the_measured_lengths(tmp_path):
    lens = [100, 300, 200, 250, 180, 90, 400, 120]
    r = bench_result(details=True, request_rate=8.0, input_lens=lens, output_lens=[16, 8, 32, 4, 20, 12, 6, 10],
                     total_input_tokens=sum(lens), total_output_tokens=108)
    (row,) = validate_runs(read_bench_results(write_lines(tmp_path / "b.jsonl", [r])), MODEL, GPU, ARGS)
    assert row["workload_check"]["total_input_tokens"] == {"measured": sum(lens), "poolsim": sum(lens)}
    assert row["workload_check"]["total_output_tokens"] == {"measured": 108.0, "poolsim": 108}
    m = row["metrics"]["median_ttft_ms"]
    assert m["error_pct"] == pytest.approx(100 * (m["poolsim"] / m["measured"] - 1))
    assert row["per_request"]["requests"] == 8 and row["workload"]["request_rate"] == 8.0
    json.dumps(row, allow_nan=False)


def test_calibrate_from_server_log_decode_lines(tmp_path):
    """Decode lines of ten batches (4-250 requests), six lines each after a prefill: the first line of each batch is
    marked (a prefill in its interval), the other five are clean; their times from a known roofline, 3 % noise."""
    from tests.telemetry.samples import prefill_0523

    cost, _ = cost_of(MODEL, GPU, ARGS)
    truth = step_time.Coefficients(hbm_efficiency_sm90=0.62, step_overhead_s=0.004)
    clock = step_time.AnalyticStepTime(cost, truth)
    rng = np.random.default_rng(0)
    lines, sec = [], 0
    for batch in (4, 8, 16, 32, 64, 96, 128, 160, 200, 250):
        kv = batch * int(rng.integers(500, 6000))
        lines.append(prefill_0523(sec % 60, batch, kv))
        for _ in range(6):
            kv += batch * 40  # the interval's 40 steps
            mean_kv = int(kv - batch * 39 / 2)
            t = clock.time_of(0, batch, 0, mean_kv, mean_kv, batch) * np.exp(0.03 * rng.standard_normal())
            lines.append(decode_0523(sec % 60, batch, kv, batch / t))
            sec += 1
    log = read_server_log(write_lines(tmp_path / "server.log", lines))
    rec = calibrate_measured([log], MODEL, GPU, ARGS, log=lambda *_: None)
    assert rec["fit"]["fitted"] == ["hbm_efficiency_sm90", "step_overhead_s"]  # decode only: no prefill term
    assert rec["coefficients"]["hbm_efficiency_sm90"] == pytest.approx(0.62, rel=0.05)
    assert rec["coefficients"]["step_overhead_s"] == pytest.approx(0.004, rel=0.1)
    assert "no effect" in rec["kept_defaults"]["mfu_sm90"]
    assert rec["skipped"]["server-log: prefill in interval"] == 9 and rec["fit"]["n"] == 50
