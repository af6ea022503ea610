"""The three readers on hand-written lines in SGLang's formats: what each reads, marks, skips and refuses."""

import json
import math

import pytest

from poolsim.telemetry import (
    TelemetryError,
    detect,
    load_measured,
    prefill_pairs,
    read_bench_results,
    read_fpm,
    read_server_log,
)
from tests.telemetry.samples import (
    DECODE_04,
    DECODE_04_GRAPH,
    DECODE_HYBRID,
    DECODE_SPEC,
    MAMBA_0523,
    PREFILL_04,
    STARTUP_0523,
    bench_result,
    decode_0523,
    fpm,
    prefill_0523,
    write_lines,
)


# ------------------------------------------------------------------------------------------ forward-pass metrics
def test_fpm_reads_each_kind_and_skips_idle_heartbeats(tmp_path):
    idle = fpm(3, 0.0)
    path = write_lines(tmp_path / "fpm.jsonl", [
        fpm(0, 0.050, n_p=2, e=3000, var_p=250000.0, p=0),  # two prompts of 1000 and 2000 tokens
        fpm(1, 0.012, n_d=2, kv=3002),
        fpm(2, 0.030, n_p=1, e=500, p=1000, n_d=2, kv=3004),
        idle, fpm(5, 0.0, n_d=1, kv=10), fpm(6, 0.004)])
    src = read_fpm(path)
    assert [s.kind for s in src.steps] == ["prefill", "decode", "mixed"]
    assert [s.measured_s for s in src.steps] == [0.050, 0.012, 0.030]
    assert [s.line for s in src.steps] == [1, 2, 3]
    assert src.skips.counts == {"idle heartbeat (all zeros, wall_time 0)": 1,
                                "no GPU span (wall_time 0 with requests scheduled)": 1,
                                "no request scheduled (an idle or DP-synchronisation forward)": 1}
    assert src.skips.first["idle heartbeat (all zeros, wall_time 0)"] == f"{path}:4"
    assert src.notes["lost_messages"] == 1  # counter 4 never arrived
    # prefill: two whole prompts 1000 + 2000: sum e^2 = 5e6 = E^2/n + n var
    e, d, pairs, dpairs, ctx, n = src.steps[0].time_args
    assert (e, d, dpairs, ctx, n) == (3000, 0, 0, 3000, 2)
    assert pairs == (1000 * 1001 + 2000 * 2001) // 2
    assert src.steps[2].time_args == (500, 2, 500 * 1000 + 500 * 501 // 2, 3004, 1000 + 500 + 3004, 3)


def test_prefill_pairs_is_exact_for_one_request_and_capped():
    assert prefill_pairs(1, 100, 50, 0.0) == 100 * 50 + 100 * 101 / 2
    assert prefill_pairs(4, 100, 0, 1e9) == (100 * 100 + 100) / 2  # never more than one request holding all
    assert prefill_pairs(0, 0, 0, 0.0) == 0


@pytest.mark.parametrize("edit, field", [
    (lambda r: r.pop("wall_time"), "wall_time"),
    (lambda r: r["scheduled_requests"].pop("sum_decode_kv_tokens"), "scheduled_requests.sum_decode_kv_tokens"),
    (lambda r: r.update(dp_rank=-1), "dp_rank"),
    (lambda r: r.update(wall_time="fast"), "wall_time"),
    (lambda r: r.update(version=2), "version"),
    (lambda r: r.pop("timestamp"), "timestamp"),
])
def test_fpm_names_the_file_line_and_field_it_cannot_use(tmp_path, edit, field):
    bad = fpm(1, 0.01, n_d=1, kv=5)
    edit(bad)
    path = write_lines(tmp_path / "fpm.jsonl", [fpm(0, 0.01, n_d=1, kv=4), bad])
    with pytest.raises(TelemetryError) as e:
        read_fpm(path)
    assert e.value.line == 2 and e.value.field == field
    assert str(e.value).startswith(f"{path}:2: field {field!r}") and "\n" not in str(e.value)


def test_fpm_rejects_a_line_that_is_not_json(tmp_path):
    path = tmp_path / "fpm.jsonl"
    path.write_text(json.dumps(fpm(0, 0.01, n_d=1, kv=4)) + "\n{not json\n")
    with pytest.raises(TelemetryError, match=r"fpm.jsonl:2: invalid JSON"):
        read_fpm(path)


# ------------------------------------------------------------------------------------------ server logs
def test_log_decode_step_time_kv_and_marks(tmp_path):
    lines = [*STARTUP_0523,
             prefill_0523(3, 32, 32768),
             decode_0523(10, 32, 41216, 2765.43),  # first decode line: its interval began at startup
             decode_0523(11, 32, 42496, 2800.00),  # clean: same batch, nothing else ran
             prefill_0523(12, 1, 1024),
             decode_0523(13, 33, 44000, 2700.00),  # a prefill ran inside this interval
             decode_0523(14, 30, 43000, 2600.00),  # three finished inside it
             decode_0523(15, 30, 44200, 2600.00, queue=5),  # requests wait: saturated
             decode_0523(16, 30, 45400, 2610.00)]
    log = read_server_log(write_lines(tmp_path / "server.log", lines))
    assert [s.marks for s in log.steps] == [("first interval", "prefill in interval"), (), ("prefill in interval",),
                                            ("draining",), ("saturated",), ()]
    clean = log.steps[1]
    assert clean.line == 6 and clean.kind == "decode" and clean.rank == "TP0" and clean.cuda_graph is True
    assert clean.measured_s == pytest.approx(32 / 2800.0)
    assert clean.decode_kv_tokens == 42496 - 32 * 39 / 2  # the interval's mean, not its end
    assert clean.timestamp == pytest.approx(1793614511.0)  # 2026-11-02 10:15:11 UTC
    assert log.notes["decode_lines"] == 6 and log.notes["prefill_lines"] == 2
    assert log.skips.counts == {next(iter(log.skips.counts)): 2}  # the prefill lines: no step time
    assert log.sizes == [{"line": 1, "weights": {"line": 1, "type": "LlamaForCausalLM", "avail_mem_gb": 63.21,
                                                 "mem_usage_gb": 14.99},
                          "kv_cache": [{"line": 2, "label": None, "dtype": "torch.bfloat16", "tokens": 413868,
                                        "k_size_gb": 25.26, "v_size_gb": 25.26}],
                          "summary_line": 3, "max_total_num_tokens": 413868, "chunked_prefill_size": 8192,
                          "max_prefill_tokens": 16384, "max_running_requests": 4096, "context_len": 131072,
                          "available_gpu_mem_gb": 10.51}]


def test_log_reads_the_04_formats_hybrid_pools_and_speculative_lines(tmp_path):
    log = read_server_log(write_lines(tmp_path / "server.log",
                                      [PREFILL_04, DECODE_04, DECODE_04_GRAPH, MAMBA_0523, DECODE_HYBRID, DECODE_SPEC]))
    old, graph, hybrid, spec = log.steps
    assert old.measured_s == pytest.approx(8 / 600.12) and old.cuda_graph is None
    assert old.marks == ("first interval", "prefill in interval")
    assert graph.marks == () and graph.cuda_graph is True and graph.decode_kv_tokens == 9320 - 8 * 39 / 2
    assert hybrid.decode_kv_tokens == 20000 - 16 * 39 / 2 and hybrid.marks == ("batch changed",)
    assert spec.measured_s == pytest.approx(4 * 2.5 / 500.0)  # running x accept len / gen throughput
    assert spec.decode_kv_tokens == 5000 - 4 * 2.5 * 39 / 2
    assert "speculative" in spec.marks and "draining" in spec.marks
    assert log.sizes[0]["mamba_cache"] == {"line": 4, "max_mamba_cache_size": 256, "conv_state_gb": 0.10,
                                           "ssm_state_gb": 3.51}


def test_log_interval_and_ranks_are_kept_apart(tmp_path):
    lines = [decode_0523(10, 8, 9000, 800.0, prefix="DP0 TP0"), decode_0523(10, 4, 5000, 400.0, prefix="DP1 TP0"),
             prefill_0523(11, 1, 100, prefix="DP1 TP0"),
             decode_0523(12, 8, 9320, 800.0, prefix="DP0 TP0"), decode_0523(12, 5, 5200, 450.0, prefix="DP1 TP0")]
    log = read_server_log(write_lines(tmp_path / "server.log", lines), decode_log_interval=10)
    assert [(s.rank, s.marks) for s in log.steps] == [
        ("DP0 TP0", ("first interval",)), ("DP1 TP0", ("first interval",)), ("DP0 TP0", ()),
        ("DP1 TP0", ("prefill in interval",))]
    assert log.steps[2].decode_kv_tokens == 9320 - 8 * 9 / 2


def test_log_skips_batch_lines_it_cannot_use_naming_their_line(tmp_path):
    lines = [decode_0523(10, 8, 9000, 800.0),
             decode_0523(11, 8, 9000, 800.0).replace("#token: 9000, ", ""),  # no KV count
             decode_0523(12, 8, 9000, 800.0).replace("#running-req: 8", "#running-req: many"),
             "Decode batch, #running-req: 1 (no header)", "an unrelated line"]
    log = read_server_log(write_lines(tmp_path / "server.log", lines))
    assert len(log.steps) == 1
    assert log.skips.first == {"decode line without '#token'": f"{tmp_path}/server.log:2",
                               "decode line with an unreadable value ('#running-req')": f"{tmp_path}/server.log:3",
                               "batch line without SGLang's [date time] header": f"{tmp_path}/server.log:4"}


def test_log_finds_the_header_behind_other_prefixes_and_milliseconds(tmp_path):
    line = "(Scheduler pid=77, ip=10.0.0.1) " + decode_0523(10, 8, 9000, 800.0).replace(":10 TP0]", ":10.250 TP0]")
    log = read_server_log(write_lines(tmp_path / "server.log", [line]))
    assert log.steps[0].timestamp % 60 == pytest.approx(10.25)


# ------------------------------------------------------------------------------------------ bench_serving results
def test_bench_result_workload_and_metrics(tmp_path):
    path = write_lines(tmp_path / "bench.jsonl", [bench_result(), bench_result(details=True, request_rate=4.0)])
    plain, detailed = read_bench_results(path)
    assert plain.workload["dataset_name"] == "random-ids" and math.isinf(plain.workload["request_rate"])
    assert plain.workload["num_prompts"] == 8 and plain.workload["num_prompts_from"].startswith("completed")
    assert plain.workload["seed"] is None  # bench_serving does not write it: never guessed
    assert plain.details is None and plain.measured["median_ttft_ms"] == 40.0 and plain.missing == []
    assert detailed.workload["request_rate"] == 4.0 and detailed.line == 2
    assert detailed.details["output_lens"] == [32] * 8 and all(detailed.details["ok"])


@pytest.mark.parametrize("over, field", [
    ({"completed": None}, "completed"), ({"request_rate": -1}, "request_rate"),
    ({"random_range_ratio": 2}, "random_range_ratio"), ({"median_ttft_ms": "x"}, "median_ttft_ms"),
    ({"input_lens": [1, 2]}, "output_lens"),
])
def test_bench_result_names_what_it_cannot_use(tmp_path, over, field):
    r = bench_result(**over)
    if over.get("completed", 0) is None:
        del r["completed"]
    if "input_lens" in over:
        r = bench_result(details=True, **over)
    path = write_lines(tmp_path / "bench.jsonl", [bench_result(), r])
    with pytest.raises(TelemetryError) as e:
        read_bench_results(path)
    assert e.value.line == 2 and e.value.field == field


def test_bench_result_keeps_missing_metrics_missing(tmp_path):
    r = bench_result()
    del r["p99_itl_ms"], r["accept_length"]  # absent keys (a null one is just not measured)
    (run,) = read_bench_results(write_lines(tmp_path / "bench.jsonl", [r]))
    assert "p99_itl_ms" not in run.measured and set(run.missing) == {"p99_itl_ms", "accept_length"}


# ------------------------------------------------------------------------------------------ format detection
def test_detect_and_load_measured(tmp_path):
    f = write_lines(tmp_path / "a.jsonl", [fpm(0, 0.01, n_d=1, kv=4)])
    b = write_lines(tmp_path / "b.jsonl", [bench_result()])
    log = write_lines(tmp_path / "c.log", [decode_0523(10, 8, 9000, 800.0)])
    assert [detect(p) for p in (f, b, log)] == ["fpm", "bench-serving", "server-log"]
    steps, runs = load_measured([f, b, log])
    assert [s.format for s in steps] == ["fpm", "server-log"] and len(runs) == 1
    with pytest.raises(TelemetryError, match="neither a ForwardPassMetrics record"):
        detect(write_lines(tmp_path / "d.jsonl", [{"hello": 1}]))
    with pytest.raises(TelemetryError, match="not an SGLang server log"):
        load_measured([write_lines(tmp_path / "e.log", ["just text"])])
