"""HiCache end to end: run with a host tier on the bundled Mooncake head, per-tier cached tokens, the host step
columns, --check, the CLI and the sweep grid."""

import json

import pytest
from typer.testing import CliRunner

from poolsim.app.run import simulate
from poolsim.cli import app
from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.server_args import ServerArgs
from poolsim.sim.metrics import HOST_STEP_COLUMNS
from poolsim.traces import load_trace, slice_trace
from tests.sim.test_reference_equivalence import MOONCAKE

LLAMA = ModelConfig.load("llama-3.1-8b")
H100 = get_gpu("H100")
SMALL = dict(max_total_tokens=60_000)  # room for a few Mooncake prompts: their next turns come back within ratio 4


def _trace():
    return slice_trace(load_trace(MOONCAKE), 0, 60)


@pytest.fixture(scope="module")
def runs():
    off = simulate(_trace(), LLAMA, H100, ServerArgs(**SMALL), step_time="fixed:20")
    on = simulate(_trace(), LLAMA, H100, ServerArgs(enable_hierarchical_cache=True, hicache_ratio=4.0, **SMALL),
                  step_time="fixed:20", check=True)
    return off, on


def test_the_host_tier_saves_prefill_the_device_only_run_recomputes(runs):
    off, on = runs
    tiers = on.summary["cached_prefill_tokens_by_tier"]
    assert tiers["host"] > 0 and tiers["storage"] == 0
    assert tiers["device"] + tiers["host"] == on.summary["cached_prefill_tokens"]
    assert on.summary["cached_prefill_tokens"] > off.summary["cached_prefill_tokens"]
    assert on.summary["prefill_tokens"] < off.summary["prefill_tokens"]
    h = on.summary["hicache"]
    assert h["loaded_back_tokens"] == tiers["host"] and h["written_tokens"] > 0
    assert 0 < h["host_peak_used_frac"] <= 1 and h["host_capacity_tokens"] == on.plan.hicache.host_tokens
    assert "HiCache:" in on.summary["verdict"]


def test_host_columns_only_with_hicache(runs):
    off, on = runs
    assert all(c in on.steps for c in HOST_STEP_COLUMNS)
    assert not any(c in off.steps for c in HOST_STEP_COLUMNS)
    assert "cached_prefill_tokens_by_tier" not in off.summary and "hicache" not in off.summary
    assert int(on.steps["host_loaded_tokens"].sum()) == on.summary["cached_prefill_tokens_by_tier"]["host"]
    assert (on.steps["host_used_size"] <= on.plan.hicache.host_tokens).all()


@pytest.mark.parametrize("policy", ["write_through_selective", "write_back"])
def test_every_write_policy_runs_checked(policy):
    r = simulate(_trace(), LLAMA, H100, ServerArgs(enable_hierarchical_cache=True, hicache_ratio=4.0,
                                                   hicache_write_policy=policy, **SMALL),
                 step_time="fixed:20", check=True)
    assert r.summary["hicache"]["write_policy"] == policy and r.summary["hicache"]["written_tokens"] > 0
    assert r.summary["finished"] == 157


def test_hybrid_models_are_sized_but_not_simulated():
    with pytest.raises(ValueError, match="run simulates the HiCache host tier for MHA and MLA models"):
        simulate(_trace(), ModelConfig.load("kimi-linear-48b-a3b"), get_gpu("H200"),
                 ServerArgs(enable_hierarchical_cache=True, max_total_tokens=60_000), step_time="fixed:20")


def test_run_json_and_sweep_grid():
    runner = CliRunner()
    trace = str(MOONCAKE)
    base = ["--model", "llama-3.1-8b", "--gpu", "H100", "--max-total-tokens", "60000", "--step-time", "fixed:20"]
    res = runner.invoke(app, ["run", trace, *base, "--enable-hicache", "--hicache-ratio", "2", "--json", "--quiet"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out["cached_prefill_tokens_by_tier"]) == {"device", "host", "storage"}
    res = runner.invoke(app, ["sweep", trace, "--model", "llama-3.1-8b", "--gpu", "H100", "--max-total-tokens",
                              "60000", "--enable-hierarchical-cache", "--grid", "hicache_ratio=1,4", "--workers", "1",
                              "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["configs"]
    assert [r["hicache_ratio"] for r in rows] == [1, 4] and all(r["error"] == "" for r in rows)
    assert rows[1]["cache_hit_rate"] >= rows[0]["cache_hit_rate"]
