"""Sweeps: the grid syntax, the combinations, the cheapest configuration meeting an SLO, the command."""

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from poolsim.app.sweep import cheapest_meeting, expand, label, parse_grid
from poolsim.cli import app


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


SMALL_GRID = (["tp=1,3", "page_size=1,16"], {"model": "llama-3.1-8b", "gpu": "H100"})


def _small_sweep(grid=SMALL_GRID[0], **kw):
    from poolsim.app.sweep import run_sweep
    from poolsim.traces import DEFAULT_TRACE

    calls = []
    table = run_sweep(str(DEFAULT_TRACE), SMALL_GRID[1], parse_grid(grid), {"H100": 2.5},
                      progress=lambda done, total: calls.append((done, total)), **kw)
    return table, calls


def test_progress_counts_configurations_and_rows_keep_grid_order():
    table, calls = _small_sweep(workers=2)
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]  # configurations, not requests
    assert table["label"].tolist() == ["tp=1 page=1", "tp=1 page=16", "tp=3 page=1", "tp=3 page=16"]
    # counts stay integers beside the refused rows
    assert str(table["gpus"].dtype) == "Int64" and table["gpus"].tolist()[:2] == [1, 1]
    assert table["gpus"].isna().tolist() == [False, False, True, True]


def test_sweep_on_ray_gives_the_local_table():
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'poolsim[ray]')")
    grid = ["tp=3,1", "page_size=16"]  # a refused configuration first, then one that runs
    local, _ = _small_sweep(grid, workers=1)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        on_ray, calls = _small_sweep(grid, ray=True)
    finally:
        ray.shutdown()
    assert calls == [(1, 2), (2, 2)]
    pd.testing.assert_frame_equal(on_ray, local)  # every number, every error string, the same order
    assert on_ray["label"].tolist() == ["tp=3 page=16", "tp=1 page=16"]
    assert on_ray["error"].tolist()[1] == "" and on_ray["throughput_tok_s"].tolist()[1] > 0


def test_ray_missing_is_a_one_line_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ValueError, match=r"--ray needs Ray: pip install 'poolsim\[ray\]'"):
        _small_sweep(ray=True)
    res = CliRunner().invoke(app, ["sweep", "--model", "llama-3.1-8b", "--gpu", "H100", "--grid", "tp=1",
                                   "--ray"])
    assert res.exit_code == 2 and "--ray needs Ray" in res.output


def test_sweep_table_prints_counts_as_integers():
    res = CliRunner().invoke(app, ["sweep", "--model", "llama-3.1-8b", "--gpu", "H100", "--grid", "tp=1,3",
                                   "--workers", "1"])
    assert res.exit_code == 0, res.output
    lines = {ln.split()[0]: ln.split() for ln in res.output.splitlines() if ln.strip().startswith("tp=")}
    # label gpus throughput p99_ttft p99_e2e retractions aborted binding ... : counts are "1" and "0", not "1.00"
    assert lines["tp=1"][1] == "1" and lines["tp=1"][5:7] == ["0", "0"]
    assert lines["tp=3"][1:8] == ["-"] * 7 and "does not divide" in res.output
    assert "nan" not in res.output.lower() and "<NA>" not in res.output
    res = CliRunner().invoke(app, ["sweep", "--model", "llama-3.1-8b", "--gpu", "H100", "--grid", "tp=1,3",
                                   "--workers", "1", "--json"])
    rows = {r["label"]: r for r in json.loads(res.output)["configs"]}
    assert rows["tp=1"]["gpus"] == 1 and isinstance(rows["tp=1"]["retractions"], int)
    assert rows["tp=3"]["gpus"] is None and rows["tp=3"]["throughput_tok_s"] is None  # null, not NaN


def test_the_readme_sweep_example_shows_a_cheapest_passing_configuration():
    import re
    import shlex
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    command = re.search(r"poolsim (sweep [^#]*?)#", readme.replace("\\\n", " "), re.S).group(1)
    argv = [a for a in shlex.split(command) if a]
    argv = argv[:argv.index("--out")] + argv[argv.index("--out") + 2:]  # no files from a test
    res = CliRunner().invoke(app, argv + ["--json", "--workers", "2"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    verdicts = [r["meets_slo"] for r in out["configs"]]
    assert any(verdicts) and not all(verdicts)  # a grid where some configurations pass and some do not
    assert any(r["error"] for r in out["configs"])  # and SGLang refuses one
    cheapest = [r for r in out["configs"] if r["label"] == out["cheapest_meeting_slo"]][0]
    assert cheapest["meets_slo"] and cheapest["cost"] == min(r["cost"] for r in out["configs"] if r["meets_slo"])
