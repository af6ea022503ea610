"""`run --out` streams the step table into the folder it publishes; --table-format csv|parquet; `report` reads
either (issue #11, "Scale")."""

import os
import sys

import pandas as pd
from typer.testing import CliRunner

from poolsim.app import run as app_run
from poolsim.app.output import MARKER, read_run
from poolsim.cli import app
from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.server_args import ServerArgs
from poolsim.sim.metrics import Recorder
from poolsim.traces import load_trace
from tests.helpers import small_trace

runner = CliRunner()
SERVER = ["--model", "llama-3.1-8b", "--gpu", "H100"]


def small_chunks(monkeypatch, rows=7):
    """Many chunks on a short run, so the streamed file is written in pieces."""
    monkeypatch.setattr(app_run, "Recorder", lambda d, fmt, _, **kw: Recorder(d, fmt, rows, **kw))


def listed(folder):
    return (folder / MARKER).read_text().splitlines()[1:]


def test_streamed_csv_tables_are_byte_identical_to_the_whole_frames(tmp_path, monkeypatch):
    trace, out = small_trace(tmp_path), tmp_path / "out"
    whole = app_run.simulate(load_trace(trace), ModelConfig.load("llama-3.1-8b"), get_gpu("H100"), ServerArgs())
    small_chunks(monkeypatch)
    res = runner.invoke(app, ["run", str(trace), *SERVER, "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert len(whole.steps) > 7 * 10  # the step file was written in more than ten chunks
    assert (out / "steps.csv").read_text() == whole.steps.to_csv(index=False)
    assert (out / "requests.csv").read_text() == whole.requests.to_csv(index=False)
    assert {"steps.csv", "requests.csv", "summary.json", "run.json", "report.html"} <= set(listed(out))


def test_parquet_round_trip_through_report(tmp_path, monkeypatch):
    trace, out, csv_out = small_trace(tmp_path), tmp_path / "pq", tmp_path / "csv"
    small_chunks(monkeypatch)
    res = runner.invoke(app, ["run", str(trace), *SERVER, "--out", str(out), "--quiet", "--table-format", "parquet"])
    assert res.exit_code == 0, res.output
    assert not (out / "steps.csv").exists() and not (out / "requests.csv").exists()
    assert {"steps.parquet", "requests.parquet"} <= set(listed(out))
    assert runner.invoke(app, ["run", str(trace), *SERVER, "--out", str(csv_out), "--quiet"]).exit_code == 0
    steps, requests, summary, run = read_run(out)
    csv_steps, csv_requests, csv_summary, _ = read_run(csv_out)
    pd.testing.assert_frame_equal(steps, csv_steps)
    csv_requests["abort_cause"] = csv_requests["abort_cause"].astype(object).fillna("")  # CSV reads "" back as missing
    pd.testing.assert_frame_equal(requests, csv_requests, check_dtype=False)
    assert summary == csv_summary
    os.remove(out / "report.html")
    res = runner.invoke(app, ["report", str(out)])
    assert res.exit_code == 0, res.output
    page = (out / "report.html").read_text()
    assert 'href="steps.parquet"' in page and 'href="requests.parquet"' in page and 'href="steps.csv"' not in page
    assert "report.html" in listed(out)


def test_parquet_without_pyarrow_is_one_line_before_simulating(tmp_path, monkeypatch):
    trace, out = small_trace(tmp_path), tmp_path / "out"
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    monkeypatch.setattr(app_run, "simulate", lambda *a, **k: (_ for _ in ()).throw(AssertionError("simulated")))
    res = runner.invoke(app, ["run", str(trace), *SERVER, "--out", str(out), "--table-format", "parquet"])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0] == "error: --table-format parquet: needs pyarrow, which is not installed " \
                       "(pip install 'poolsim[parquet]')"
    assert sorted(os.listdir(tmp_path)) == ["small.jsonl"]
    res = runner.invoke(app, ["run", str(trace), *SERVER, "--table-format", "xlsx"])
    assert res.exit_code == 2 and "table format 'xlsx': expected one of csv, parquet" in res.output


def test_a_users_file_in_a_streamed_run_folder_is_never_deleted(tmp_path):
    trace, out = small_trace(tmp_path), tmp_path / "out"
    args = ["run", str(trace), *SERVER, "--out", str(out), "--quiet", "--table-format", "parquet"]
    assert runner.invoke(app, args).exit_code == 0
    (out / "notes.txt").write_text("mine\n")
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "holds files poolsim did not write (notes.txt)" in res.output, res.output
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "steps.parquet").exists()
    assert sorted(os.listdir(tmp_path)) == ["out", "small.jsonl"]  # no temporary folder or lock left behind


def test_a_failed_run_leaves_nothing_in_the_folder_it_was_streaming_into(tmp_path, monkeypatch):
    trace, out = small_trace(tmp_path), tmp_path / "out"

    def fail(*a, stream_dir=None, **k):
        assert stream_dir is not None and stream_dir.name.startswith(".out-")  # the hidden folder being filled
        (stream_dir / "steps.csv").write_text("step\n")
        raise ValueError("boom")

    monkeypatch.setattr(app_run, "simulate", fail)
    res = runner.invoke(app, ["run", str(trace), *SERVER, "--out", str(out)])
    assert res.exit_code == 2 and "boom" in res.output
    assert sorted(os.listdir(tmp_path)) == ["small.jsonl"]


def test_compare_model_streams_each_run_into_its_own_subfolder(tmp_path):
    trace, out = small_trace(tmp_path), tmp_path / "out"
    res = runner.invoke(app, ["run", str(trace), *SERVER, "--compare-model", "llama-3.1-70b", "--compare-tp", "4",
                              "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[-1] == f"wrote {out}/comparison.html, {out}/primary/ and {out}/compare/"
    for sub, model in (("primary", "llama-3.1-8b"), ("compare", "llama-3.1-70b")):
        steps, requests, summary, run = read_run(out / sub)
        assert run["model"] == model and summary["steps"] == len(steps) > 0 and len(requests) == summary["requests"]
        assert {"steps.csv", "requests.csv", "report.html"} <= set(listed(out / sub))
    assert (out / "comparison.html").exists() and sorted(os.listdir(tmp_path)) == ["out", "small.jsonl"]
