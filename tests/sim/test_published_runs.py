"""The published-run data file behind the fitted step-time defaults: every case is sourced and replayable."""

import csv
import importlib.util
import re
import sys
from pathlib import Path

import numpy as np

from pools.gpu_catalog import get_gpu
from pools.model_config import ModelConfig
from traces.bench_serving import random_lens

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
    assert ta.client_flag({"notes": "--num-warmups 8"}, "--warmup-requests", 1) == 8.0
    assert ta.client_flag({"notes": ""}, "--warmup-requests", 1) == 1
    # lengths uniform on [int(1024 * 0.8), 1024] = [819, 1024]: mean 921.5; ratio 0: [1, 1024]
    assert ta.drawn_mean(1024, 0.8) == 921.5 and ta.drawn_mean(1024, 0.0) == 512.5
