"""The published-run data file behind the fitted step-time defaults: every case is sourced and replayable."""

import csv
import re
from pathlib import Path

import numpy as np

from pools.gpu_catalog import get_gpu
from pools.model_config import ModelConfig
from traces.bench_serving import random_lens

DATA = Path(__file__).resolve().parents[2] / "bench" / "data" / "published_runs.csv"
METRICS = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "mean_e2e_ms")


def rows():
    with open(DATA, newline="") as f:
        return list(csv.DictReader(f))


def test_every_case_names_its_source_version_configuration_and_a_measurement():
    cases = rows()
    assert len(cases) >= 40 and len({r["case_id"] for r in cases}) == len(cases)
    for r in cases:
        assert r["source_url"].startswith("https://github.com/sgl-project/sglang/"), r["case_id"]
        assert r["sglang_version"] and int(r["num_prompts"]) > 0 and int(r["max_concurrency"]) > 0, r["case_id"]
        assert float(r["output_throughput"]) > 0, r["case_id"]
        assert all(float(r[m]) > 0 for m in METRICS if r[m]), r["case_id"]
        if not r["skip_reason"]:
            ModelConfig.load(r["model"]), get_gpu(r["gpu"])  # replayable: both in the catalogs


def test_random_cases_are_the_prompts_bench_serving_draws_with_seed_1():
    """The replay draws the random lengths as SGLang's client does with its default --seed 1: the published input
    totals match exactly, the output totals to at most one token per request (some runs print one fewer)."""
    for r in rows():
        if r["dataset"] != "random" or r["skip_reason"]:
            continue
        ratio = re.search(r"--random-range-ratio ([0-9.]+)", r["notes"])
        ratio = float(ratio.group(1)) if ratio else 0.0
        rng, n = np.random.RandomState(1), int(r["num_prompts"])
        drawn_in = sum(random_lens(int(r["input_len"]), ratio, n, rng))
        drawn_out = sum(random_lens(int(r["output_len"]), ratio, n, rng))
        assert drawn_in == int(r["total_input_tokens"]), r["case_id"]
        assert 0 <= drawn_out - int(r["total_output_tokens"]) <= n, r["case_id"]
