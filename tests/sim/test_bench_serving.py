"""bench_serving's client against the simulated server, with a fixed 10 ms step so every time is derivable by hand.

Plain loop (--disable-overlap-schedule), 100-token prompts, 3 output tokens with ignore_eos: a prefill step
gives the first token, two decode steps the other two, so a request alone takes 30 ms and its TTFT is 10 ms.
"""

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from poolsim.app.bench_serving import BenchConfig, calculate_metrics, format_result, run_bench
from poolsim.app.run import simulate
from poolsim.cli import app
from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.server_args import ServerArgs
from poolsim.sim.engine import Barrier
from poolsim.traces.request import Request

PLAIN = ServerArgs(disable_overlap_schedule=True)


def req(rid, t=0.0, n=100, seg=None):
    return Request(rid=rid, arrival_s=t, input_len=n, output_len=3, max_new_tokens=3, ignore_eos=True,
                   segments=((seg if seg is not None else 1000 + rid, n),))


def sim(trace, **kw):
    return simulate(trace, ModelConfig.load("llama-3.1-8b"), get_gpu("H100"), PLAIN, step_time="fixed:10", **kw)


def test_closed_loop_sends_the_next_request_when_one_finishes():
    """4 requests at t=0, at most 2 in flight: r0, r1 prefill together [0, 10 ms], decode to 30 ms and finish;
    r2, r3 are sent at 30 ms, first token at 40 ms, done at 60 ms. TTFT counts from the send: 10 ms each."""
    r = sim([req(i) for i in range(4)], max_concurrency=2, token_times=True).requests
    assert r["arrival_s"].tolist() == pytest.approx([0, 0, 0.03, 0.03])
    assert r["first_token_s"].tolist() == pytest.approx([0.01, 0.01, 0.04, 0.04])
    assert r["finish_s"].tolist() == pytest.approx([0.03, 0.03, 0.06, 0.06])
    assert r["ttft_s"].tolist() == pytest.approx([0.01] * 4)


def test_open_loop_rate_combined_with_a_limit():
    """Sends at 0, 5 ms and 100 ms, one in flight: r1 waits for r0's finish (30 ms); r2's own time comes later
    than r1's finish (60 ms), so it goes at 100 ms."""
    res = sim([req(0, 0.0), req(1, 0.005), req(2, 0.1)], max_concurrency=1, token_times=True)
    r = res.requests
    assert r["arrival_s"].tolist() == pytest.approx([0, 0.03, 0.1])
    assert r["ttft_s"].tolist() == pytest.approx([0.01] * 3)
    assert r["e2e_s"].tolist() == pytest.approx([0.03] * 3)
    assert res.token_times[1] == pytest.approx([0.04, 0.05, 0.06])  # one token per step


def test_without_a_limit_all_share_the_batch():
    r = sim([req(i) for i in range(4)]).requests
    assert r["first_token_s"].tolist() == pytest.approx([0.01] * 4)
    assert r["finish_s"].tolist() == pytest.approx([0.03] * 4)


@pytest.mark.parametrize("flush, cached", [(False, 99), (True, 0)])
def test_barrier_carries_the_prefix_cache_unless_flushed(flush, cached):
    """Same prompt twice with a barrier between: the warm tree gives the second one its first 99 tokens
    (SGLang matches at most len - 1 prompt tokens); /flush_cache empties the tree. The barrier ends 1 s after
    the first request finished (30 ms), so the second is sent at 1.03 s."""
    res = sim([req(0, seg=7), Barrier(1.0, flush), req(1, seg=7)])
    r = res.requests
    assert r["cached_tokens_first"].tolist() == [0, cached]
    assert res.run["phase_starts_s"] == pytest.approx([1.03])
    assert r["arrival_s"].tolist() == pytest.approx([0, 1.03])


def test_metrics_on_a_hand_table():
    """calculate_metrics' formulas on four requests, one aborted (a failed request: not counted)."""
    rows = pd.DataFrame({
        "rid": [0, 1, 2, 3], "arrival_s": [0.0, 0.2, 0.0, 1.0], "first_token_s": [0.1, 0.4, None, 1.3],
        "finish_s": [0.5, 0.4, 0.05, 2.0], "output_len": [5, 1, 0, 3], "input_len": [100, 200, 50, 300],
        "aborted": [False, False, True, False]})
    times = {0: [0.1, 0.2, 0.3, 0.4, 0.5], 1: [0.4], 3: [1.3, 1.4, 2.0]}
    m = calculate_metrics(rows, times, 0.0)
    assert m["duration"] == 2.0 and m["completed"] == 3
    assert m["total_input_tokens"] == 600 and m["total_output_tokens"] == 9
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["output_throughput"] == pytest.approx(4.5)
    assert m["total_throughput"] == pytest.approx(304.5)
    # TTFT 100, 200, 300 ms; p99 interpolates: 200 + 0.98 * 100
    assert m["mean_ttft_ms"] == pytest.approx(200) and m["median_ttft_ms"] == pytest.approx(200)
    assert m["p99_ttft_ms"] == pytest.approx(298)
    # TPOT excludes the first token and the 1-token request: 400/4 = 100, 700/2 = 350
    assert m["mean_tpot_ms"] == pytest.approx(225) and m["median_tpot_ms"] == pytest.approx(225)
    # ITL per token: 100 x4 (r0), 100 and 600 (r3)
    assert m["mean_itl_ms"] == pytest.approx(1100 / 6) and m["median_itl_ms"] == pytest.approx(100)
    assert m["max_itl_ms"] == pytest.approx(600)
    # E2E 500, 200, 1000; concurrency = sum(E2E) / duration
    assert m["mean_e2e_latency_ms"] == pytest.approx(1700 / 3) and m["median_e2e_latency_ms"] == pytest.approx(500)
    assert m["concurrency"] == pytest.approx(0.85)
    # per-second buckets from the first send: tokens 6 | 2 | 1, requests in flight 2 | 1 | 1
    assert m["max_output_tokens_per_s"] == 6 and m["max_concurrent_requests"] == 2


def test_bench_run_excludes_the_warmup_and_counts_from_the_first_send():
    """random-ids, ratio 1 (fixed lengths 100 in, 3 out), one warm-up request (the first prompt, 3 tokens):
    it runs [0, 30 ms], the client sleeps 1 s, the two measured requests go at 1.03 s, share a prefill and two
    decodes, finish at 1.06 s. Duration 30 ms; the first prompt hits the warm tree unless flushed."""
    cfg = dict(dataset_name="random-ids", num_prompts=2, random_input_len=100, random_output_len=3,
               random_range_ratio=1.0, seed=1, warmup_requests=1)
    model, gpu = ModelConfig.load("llama-3.1-8b"), get_gpu("H100")
    for flush, cached in ((False, 99), (True, 0)):
        res, [m] = run_bench([BenchConfig(**cfg, flush_cache=flush)], model, gpu, PLAIN, step_time="fixed:10")
        assert m["completed"] == 2 and m["total_output_tokens"] == 6
        assert m["duration"] == pytest.approx(0.03)
        assert m["output_throughput"] == pytest.approx(200)
        assert m["mean_ttft_ms"] == pytest.approx(10) and m["mean_itl_ms"] == pytest.approx(10)
        assert m["mean_tpot_ms"] == pytest.approx(10)
        assert res.requests["cached_tokens_first"].tolist()[1] == cached  # rid 0 is the warm-up, rid 1 the first
    text = format_result(m)
    assert "Successful requests:                     2" in text
    assert "Output token throughput (tok/s):         200.00" in text


def test_back_to_back_runs_on_a_warm_server():
    """The same seed twice: the second run's prompts are all in the tree (99 of 100 tokens each)."""
    cfg = BenchConfig("random-ids", 3, 100, 3, 1.0, seed=4, warmup_requests=0)
    res, (m1, m2) = run_bench([cfg, cfg], ModelConfig.load("llama-3.1-8b"), get_gpu("H100"), PLAIN,
                              step_time="fixed:10")
    r = res.requests.set_index("rid")
    assert r.loc[[0, 1, 2], "cached_tokens_first"].tolist() == [0, 0, 0]
    assert r.loc[[3, 4, 5], "cached_tokens_first"].tolist() == [99, 99, 99]
    assert m1["completed"] == m2["completed"] == 3


runner = CliRunner()


def test_cli_bench_json_and_one_line_errors():
    base = ["bench", "--model", "llama-3.1-8b", "--gpu", "H100", "--dataset-name", "random-ids",
            "--num-prompts", "4", "--random-input-len", "100", "--random-output-len", "3",
            "--random-range-ratio", "1", "--disable-overlap-schedule", "--step-time", "fixed:10"]
    res = runner.invoke(app, base + ["--max-concurrency", "1,4", "--json"])
    assert res.exit_code == 0, res.output
    one, four = json.loads(res.output)
    assert one["max_concurrency"] == 1 and four["max_concurrency"] == 4
    assert one["duration"] == pytest.approx(0.12)  # 4 requests one after another, 30 ms each
    assert four["duration"] == pytest.approx(0.03)
    res = runner.invoke(app, base)
    assert res.exit_code == 0 and "Serving Benchmark Result" in res.output and "Median TTFT (ms):" in res.output
    for bad, flag in ((["--max-concurrency", "1,x"], "--max-concurrency"),
                      (["--request-rate", "1,2", "--max-concurrency", "1,2,3"], "--request-rate"),
                      (["--dataset-name", "sharegpt"], "--dataset-path"),
                      (["--dataset-name", "random"], "--standin-prompts")):
        res = runner.invoke(app, base + bad)
        assert res.exit_code == 2 and flag in res.output and res.output.count("\n") == 1, res.output
    # random without a ShareGPT file: stand-in texts; range ratio 1 makes every prompt exactly 100 tokens
    res = runner.invoke(app, base + ["--dataset-name", "random", "--standin-prompts", "--json"])
    assert res.exit_code == 0, res.output
    run = json.loads(res.output)  # one run: one result dict, as bench_serving writes it
    assert run["dataset_name"] == "random" and run["total_input_tokens"] == 400 and run["completed"] == 4


def test_closed_loop_under_the_overlap_schedule():
    """Overlap loop, one in flight: r0's decodes are launched a step ahead, but a length finish is known in
    advance, so no step rides along after its third token (30 ms); the server idles until r1 arrives at 30 ms,
    then prefills it [30, 40 ms] and decodes to 60 ms."""
    res = simulate([req(0), req(1)], ModelConfig.load("llama-3.1-8b"), get_gpu("H100"), ServerArgs(),
                   step_time="fixed:10", max_concurrency=1, token_times=True)
    r = res.requests
    assert r["arrival_s"].tolist() == pytest.approx([0, 0.03])
    assert r["first_token_s"].tolist() == pytest.approx([0.01, 0.04])
    assert res.token_times[0] == pytest.approx([0.01, 0.02, 0.03])
    assert res.token_times[1] == pytest.approx([0.04, 0.05, 0.06])
    assert res.steps["kind"].tolist() == ["extend", "decode", "decode"] * 2


def test_back_to_back_random_runs_share_prompts_through_the_cache():
    """Two bench_serving `random` runs with --seed 1 on one server (stand-in texts, --random-range-ratio 1:
    every prompt exactly the asked length): run 1 sends 2 prompts of 50 tokens, run 2 sends 3 of 80. Run 2's
    prompt 1 starts with run 1's prompt 1 (same text, cut shorter): 50 tokens from the cache; its prompt 0 was
    just sent whole by run 2's warm-up: 79 (SGLang computes at least the last token); its prompt 2 has no
    earlier copy: 0. In run 1, prompt 0 follows its warm-up (49), prompt 1 is new (0)."""
    first = BenchConfig(dataset_name="random", sharegpt_standin=True, num_prompts=2, random_input_len=50,
                        random_output_len=3, random_range_ratio=1.0, max_concurrency=1, seed=1)
    second = BenchConfig(dataset_name="random", sharegpt_standin=True, num_prompts=3, random_input_len=80,
                         random_output_len=3, random_range_ratio=1.0, max_concurrency=1, seed=1)
    result, _ = run_bench([first, second], ModelConfig.load("llama-3.1-8b"), get_gpu("H100"), PLAIN,
                          step_time="fixed:10")
    r = result.requests.set_index("rid")
    # rids: run 1's warm-up 0, prompts 1-2; run 2's warm-up 3, prompts 4-6
    assert r.loc[[1, 2], "cached_tokens_first"].tolist() == [49, 0]
    assert r.loc[[4, 5, 6], "cached_tokens_first"].tolist() == [79, 50, 0]


@pytest.mark.parametrize("interval, ttft_ms", [(1, 15), (4, 35)])
def test_scheduler_recv_interval_holds_new_requests_while_decoding(interval, ttft_ms):
    """r0 (10 output tokens) prefills [0, 10 ms] and decodes from 10 ms; r1 arrives at 25 ms. Every step polls the
    socket: r1 is read at 30 ms and prefilled [30, 40]. With --scheduler-recv-interval 4 (SGLang's recv skipper:
    +1000 after an extend step, +1 after a decode step, read at >= 4): read at 0 ms (idle) and after r0's prefill
    (10 ms), then the counter is 1, 2, 3 at 20, 30, 40 ms and reaches 4 at 50 ms: r1 prefills [50, 60]."""
    long = Request(rid=0, arrival_s=0.0, input_len=100, output_len=10, max_new_tokens=10, ignore_eos=True,
                   segments=((1000, 100),))
    res = simulate([long, req(1, 0.025)], ModelConfig.load("llama-3.1-8b"), get_gpu("H100"),
                   ServerArgs(disable_overlap_schedule=True, scheduler_recv_interval=interval), step_time="fixed:10")
    r = res.requests.set_index("rid")
    assert r.loc[1, "ttft_s"] == pytest.approx(ttft_ms / 1e3)
    # r0 loses one decode step to r1's prefill either way: 1 prefill + 9 decode + 1 paused step
    assert r.loc[0, "finish_s"] == pytest.approx(0.11)
