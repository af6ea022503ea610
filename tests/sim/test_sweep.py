"""Sweeps: the grid syntax, the combinations, the cheapest configuration meeting an SLO, the command."""

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from cli import app
from sim.sweep import cheapest_meeting, expand, label, parse_grid


def test_grid_is_typed_by_server_flags():
    grid = parse_grid(["tp=1,2", "gpu=H100,H200", "mem_fraction_static=0.8,0.85", "disable_radix_cache=true",
                       "max-running-requests=64"])
    assert grid == {"tp_size": [1, 2], "gpu": ["H100", "H200"], "mem_fraction_static": [0.8, 0.85],
                    "disable_radix_cache": [True], "max_running_requests": [64]}
    for bad in ("tp", "warp=1", "tp=x", "disable_radix_cache=maybe"):
        with pytest.raises(ValueError):
            parse_grid([bad])


def test_expand_takes_every_combination_over_the_base():
    grid = {"tp_size": [1, 2], "gpu": ["H100", "H200"]}
    configs = expand({"model": "m", "gpu": "L4", "tp_size": 4, "page_size": 16}, grid)
    assert [(c["gpu"], c["tp_size"], c["page_size"]) for c in configs] == [
        ("H100", 1, 16), ("H200", 1, 16), ("H100", 2, 16), ("H200", 2, 16)]
    assert label(configs[3], grid) == "tp=2 gpu=H200"


def test_cheapest_meeting_the_slo():
    table = pd.DataFrame([
        dict(label="a", gpus=1, cost=2.5, throughput_tok_s=100, p99_latency_s=4.0, p99_ttft_s=0.5, aborted=0, error=""),
        dict(label="b", gpus=2, cost=5.0, throughput_tok_s=150, p99_latency_s=2.0, p99_ttft_s=0.1, aborted=0, error=""),
        dict(label="c", gpus=1, cost=1.0, throughput_tok_s=90, p99_latency_s=1.0, p99_ttft_s=0.1, aborted=3, error=""),
        dict(label="d", gpus=1, cost=5.0, throughput_tok_s=200, p99_latency_s=2.0, p99_ttft_s=0.3, aborted=0, error=""),
    ])
    assert cheapest_meeting(table, 3.0)["label"] == "d"  # b and d tie on cost: d has more throughput; c aborts
    assert cheapest_meeting(table, 0.2, "ttft")["label"] == "b"
    assert cheapest_meeting(table, 0.5) is None


def test_sweep_command(tmp_path):
    res = CliRunner().invoke(app, ["sweep", "--model", "llama-3.1-8b", "--gpu", "H100", "--grid", "tp=1,3",
                                   "--grid", "page_size=1,16", "--gpu-cost", "H100=2.5", "--workers", "1",
                                   "--slo-p99-s", "60", "--out", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    rows = {r["label"]: r for r in out["configs"]}
    assert set(rows) == {"tp=1 page=1", "tp=1 page=16", "tp=3 page=1", "tp=3 page=16"}
    assert "does not divide" in rows["tp=3 page=1"]["error"]  # refused like SGLang, the sweep goes on
    assert rows["tp=1 page=16"]["cost"] == 2.5 and rows["tp=1 page=16"]["error"] == ""
    assert out["cheapest_meeting_slo"] in ("tp=1 page=1", "tp=1 page=16")
    assert (tmp_path / "sweep.csv").exists() and (tmp_path / "frontier.png").exists()
