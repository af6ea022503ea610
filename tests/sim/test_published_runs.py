"""The published-run data file behind the fitted step-time defaults: every case is sourced and replayable."""

import csv
import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.traces.bench_serving import random_lens

DATA = Path(__file__).resolve().parents[2] / "bench" / "data" / "published_runs.csv"
METRICS = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "mean_e2e_ms")
# SGLang's docs and cookbooks, and InferenceX's published SGLang runs
SOURCES = ("https://github.com/sgl-project/sglang/", "https://github.com/sgl-project/sgl-cookbook/",
           "https://github.com/SemiAnalysisAI/InferenceX/")


def rows():
    with open(DATA, newline="") as f:
        return list(csv.DictReader(f))


def test_every_case_names_its_source_version_configuration_and_a_measurement():
    cases = rows()
    assert len(cases) >= 40 and len({r["case_id"] for r in cases}) == len(cases)
    for r in cases:
        assert r["source_url"].startswith(SOURCES), r["case_id"]
        assert r["sglang_version"] and int(r["num_prompts"]) > 0 and int(r["max_concurrency"]) > 0, r["case_id"]
        # InferenceX prints throughput per GPU only: such a row measures latencies and leaves throughput empty
        assert any(r[m] for m in METRICS), r["case_id"]
        assert all(float(r[m]) > 0 for m in METRICS if r[m]), r["case_id"]
        if not r["skip_reason"]:
            ModelConfig.load(r["model"]), get_gpu(r["gpu"])  # replayable: both in the catalogs


def test_random_cases_are_the_prompts_bench_serving_draws_with_seed_1():
    """The replay draws the random lengths as SGLang's client does with its default --seed 1: the published input
    totals match exactly, the output totals to at most one token per request (some runs print one fewer)."""
    for r in rows():
        if r["dataset"] != "random" or r["skip_reason"] or not r["total_input_tokens"]:
            continue  # InferenceX prints no token totals (its client draws with vLLM's seed)
        ratio = re.search(r"--random-range-ratio ([0-9.]+)", r["notes"])
        ratio = float(ratio.group(1)) if ratio else 0.0
        rng, n = np.random.RandomState(1), int(r["num_prompts"])
        drawn_in = sum(random_lens(int(r["input_len"]), ratio, n, rng))
        drawn_out = sum(random_lens(int(r["output_len"]), ratio, n, rng))
        assert drawn_in == int(r["total_input_tokens"]), r["case_id"]
        assert 0 <= drawn_out - int(r["total_output_tokens"]) <= n, r["case_id"]


def _time_accuracy():
    spec = importlib.util.spec_from_file_location("time_accuracy", DATA.parents[1] / "time_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["time_accuracy"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_replay_reads_the_server_flags_and_client_lengths_a_row_quotes():
    ta = _time_accuracy()
    notes = ("server: --disable-radix-cache --max-running-requests 512 --cuda-graph-max-bs 512 --chunked-prefill-size 32768 "
             "--max-prefill-tokens 32768 --mem-fraction-static 0.82 --attention-backend flashinfer --kv-cache-dtype fp8_e4m3")
    assert ta.server_flags(notes) == {"max_running_requests": 512, "chunked_prefill_size": 32768,
                                      "max_prefill_tokens": 32768, "mem_fraction_static": 0.82,
                                      "attention_backend": "flashinfer", "kv_cache_dtype": "fp8_e4m3",
                                      "disable_radix_cache": True}
    assert ta.server_flags("--disable-radix-cache-extra 1") == {}  # a longer flag name is not the switch
    # the InferenceX B200 recipes poll the socket every 10 or 30 decode steps (SchedulerRecvSkipper)
    assert ta.server_flags("--cuda-graph-max-bs 128 --scheduler-recv-interval 30 --ep-size 1") == {
        "scheduler_recv_interval": 30}
    assert ta.client_flag({"notes": "--num-warmups 8"}, "--warmup-requests", 1) == 8.0
    assert ta.client_flag({"notes": ""}, "--warmup-requests", 1) == 1
    # lengths uniform on [int(1024 * 0.8), 1024] = [819, 1024]: mean 921.5; ratio 0: [1, 1024]
    assert ta.drawn_mean(1024, 0.8) == 921.5 and ta.drawn_mean(1024, 0.0) == 512.5


def test_the_steady_state_ttft_waits_for_the_recv_interval():
    """dsr1-b200-tp8-r1k1k-c16-ix0512 runs with --scheduler-recv-interval 30: a request sent during decode waits, on
    average, (30 - 1) / 2 = 14.5 more decode steps of the 16-request batch before the scheduler reads it; a C=1
    run is read by an idle loop at once."""
    ta = _time_accuracy()
    from dataclasses import replace

    from poolsim.sim.step_time import AnalyticStepTime, Coefficients
    cases = {c.id: c for c in ta.load_cases()[0]}
    k = Coefficients()
    case = cases["dsr1-b200-tp8-r1k1k-c16-ix0512"]
    assert case.args.scheduler_recv_interval == 30
    polled = replace(case, args=case.args.replace(scheduler_recv_interval=1))
    ctx = int(np.mean(case.input_lens) + ta.drawn_mean(1024, 0.8) / 2)  # no token totals: the drawn mean output
    t_dec = AnalyticStepTime(case.cost, k).time_of(0, 16, 0, 16 * ctx, 16 * ctx, 16)
    ttft, ttft_polled = ta.predict(case, k)["mean_ttft_ms"], ta.predict(polled, k)["mean_ttft_ms"]
    assert ttft - ttft_polled == pytest.approx(14.5 * t_dec * 1e3, rel=1e-9)
    alone = cases["dsr1-b200-tp8-r1k1k-c1-ix0512"]
    assert alone.args.scheduler_recv_interval == 10
    assert ta.predict(alone, k) == ta.predict(replace(alone, args=alone.args.replace(scheduler_recv_interval=1)), k)


OPEN_LOOP = DATA.parent / "published_open_loop.csv"


def test_open_loop_runs_are_sourced_and_their_totals_are_the_clients_draws():
    """bench/data/published_open_loop.csv (H200 runs at --request-rate R): commit-pinned sources, and the printed
    token totals are bench_serving's --seed 1 draws under the row's range style (outputs: a drawn 0 counts 0 in the
    published total; the replay sends it as 1 token)."""
    with open(OPEN_LOOP, newline="") as f:
        runs = list(csv.DictReader(f))
    assert len(runs) == 5 and len({r["case_id"] for r in runs}) == 5
    for r in runs:
        assert re.match(r"https://github\.com/[\w.-]+/[\w.-]+/blob/[0-9a-f]{40}/", r["source_url"]), r["case_id"]
        assert float(r["request_rate"]) > 0 and r["sglang_version"], r["case_id"]
        ModelConfig.load(r["model"]), get_gpu(r["gpu"])
        rng = np.random.RandomState(1)
        n, ratio = int(r["num_prompts"]), float(r["range_ratio"])
        ins = random_lens(int(r["input_len"]), ratio, n, rng, r["range_style"])
        outs = random_lens(int(r["output_len"]), ratio, n, rng, r["range_style"], output=True)
        assert (sum(ins), sum(outs)) == (int(r["total_input_tokens"]), int(r["total_output_tokens"])), r["case_id"]
