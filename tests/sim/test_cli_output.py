"""What the commands write, and what they print around it: a user's files survive every command."""

import json
import os

from typer.testing import CliRunner

from poolsim import cli
from poolsim.cli import app
from poolsim.traces import load_trace
from tests.helpers import small_trace

runner = CliRunner()
SERVER = ["--model", "llama-3.1-8b", "--gpu", "H100"]


def one_error_line(res, text):
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], res.output


def test_run_refuses_a_users_folder_the_cwd_and_a_file_before_simulating(tmp_path, monkeypatch):
    trace = small_trace(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "data.csv").write_text("1,2,3\n")
    one_error_line(runner.invoke(app, ["run", str(trace), *SERVER, "--out", str(mine)]), "not written by poolsim")
    monkeypatch.chdir(mine)
    one_error_line(runner.invoke(app, ["run", str(trace), *SERVER, "--out", "."]), "current directory")
    one_error_line(runner.invoke(app, ["run", str(trace), *SERVER, "--out", "data.csv"]), "is not a folder")
    one_error_line(runner.invoke(app, ["run", str(trace), *SERVER, "--out", "data.csv/x"]), "is not a folder")
    assert os.listdir(mine) == ["data.csv"] and (mine / "data.csv").read_text() == "1,2,3\n"


def test_run_says_what_it_runs_where_it_wrote_and_that_it_replaced(tmp_path, monkeypatch):
    trace, out = small_trace(tmp_path), tmp_path / "out"
    monkeypatch.setattr(cli.RunProgress, "EVERY_S", 0.0)  # a plain progress line at every step
    res = runner.invoke(app, ["run", str(trace), *SERVER, "--out", str(out)])
    assert res.exit_code == 0, res.output
    first = res.stdout.splitlines()[0]
    n = len(load_trace(trace))
    assert first == (f"simulating llama-3.1-8b on 1 x H100 80GB SXM (tp 1, dp 1); trace small (poolsim, {n} requests); "
                     "per replica: KV pool 410,724 tokens (page 1), 2,048 request rows")
    assert res.stdout.splitlines()[-1] == f"wrote {out}/report.html"
    progress = [line for line in res.stderr.splitlines() if line.startswith("simulating llama-3.1-8b tp1: ")]
    assert progress and f"{n}/{n} requests (100%)" in progress[-1] and "ETA" in progress[-1]
    res = runner.invoke(app, ["run", str(trace), *SERVER, "--out", str(out), "--quiet"])
    assert res.exit_code == 0 and res.stderr == "", res.output
    assert res.stdout.splitlines()[-1] == f"wrote {out}/report.html (replaced the previous run there)"
    assert sorted(os.listdir(tmp_path)) == ["out", "small.jsonl"]


def test_report_out_never_replaces_a_users_folder_or_another_run(tmp_path):
    trace, run_a, run_b = small_trace(tmp_path), tmp_path / "a", tmp_path / "b"
    for d in (run_a, run_b):
        assert runner.invoke(app, ["run", str(trace), *SERVER, "--out", str(d), "--quiet"]).exit_code == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("x")
    one_error_line(runner.invoke(app, ["report", str(run_a), "--out", str(mine)]), "not written by poolsim")
    one_error_line(runner.invoke(app, ["report", str(run_a), "--out", str(run_b)]), "holds another run")
    assert (mine / "keep.txt").read_text() == "x" and (run_b / "steps.csv").exists()
    res = runner.invoke(app, ["report", str(run_a), "--compare", str(run_b), "--out", str(tmp_path / "page"),
                              "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"page": str(tmp_path / "page" / "comparison.html"),
                                      "runs": [str(run_a), str(run_b)]}
    res = runner.invoke(app, ["report", str(run_a), "--compare", str(run_b)])  # in place: recorded in the marker
    assert res.exit_code == 0, res.output
    assert "comparison.html" in (run_a / ".poolsim-run").read_text().splitlines()
    assert runner.invoke(app, ["run", str(trace), *SERVER, "--out", str(run_a), "--quiet"]).exit_code == 0


def test_trace_outputs_replace_only_poolsim_traces_unless_forced(tmp_path):
    src = small_trace(tmp_path)
    mooncake = tmp_path / "theirs.jsonl"
    mooncake.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n')
    res = runner.invoke(app, ["trace", "convert", str(src), str(mooncake)])
    one_error_line(res, "exists and was not written by poolsim; add --force")
    assert load_trace(mooncake).format == "mooncake"
    res = runner.invoke(app, ["trace", "generate", str(mooncake), "--sessions", "2"])
    one_error_line(res, "add --force")
    assert runner.invoke(app, ["trace", "convert", str(mooncake), str(src)]).exit_code == 0  # poolsim's own
    assert runner.invoke(app, ["trace", "slice", str(src), str(mooncake), "--force"]).exit_code == 0
    assert load_trace(mooncake).format == "poolsim"
    assert sorted(os.listdir(tmp_path)) == ["small.jsonl", "theirs.jsonl"]


def test_plan_plot_replaces_only_its_own_png(tmp_path):
    png = tmp_path / "cmp.png"
    png.write_bytes(b"\x89PNG a user's picture")
    argv = ["plan", "--model", "kimi-linear-48b-a3b", "--gpu", "H200", "--compare", "--plot", str(png)]
    one_error_line(runner.invoke(app, argv), "exists and was not written by poolsim; add --force")
    assert png.read_bytes() == b"\x89PNG a user's picture"
    assert runner.invoke(app, argv + ["--force"]).exit_code == 0
    assert b"Software\x00poolsim" in png.read_bytes()[:4096]
    assert runner.invoke(app, argv).exit_code == 0  # poolsim's own picture: replaced without --force
    assert os.listdir(tmp_path) == ["cmp.png"]


def test_sweep_refuses_a_users_folder_before_sweeping(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("x")
    res = runner.invoke(app, ["sweep", *SERVER, "--grid", "tp=1,2", "--out", str(mine)])
    one_error_line(res, "not written by poolsim")
    assert os.listdir(mine) == ["keep.txt"]
