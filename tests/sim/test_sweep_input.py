"""A sweep's bad trace is bad input for the whole command: one line, exit 2, before any configuration runs."""

from typer.testing import CliRunner

from cli import app


def test_sweep_refuses_a_bad_trace_before_simulating(tmp_path):
    trace = tmp_path / "empty.json"
    trace.write_text("[]\n")  # ShareGPT with no conversation: no request at all
    res = CliRunner().invoke(app, ["sweep", str(trace), "--model", "llama-3.1-8b", "--grid", "gpu=H100,H200",
                                   "--workers", "1"])
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error: ") and res.output.count("\n") == 1
    assert "empty.json: no requests" in res.output


def test_sweep_refuses_a_directory_as_trace(tmp_path):
    res = CliRunner().invoke(app, ["sweep", str(tmp_path), "--model", "llama-3.1-8b", "--gpu", "H100",
                                   "--grid", "tp=1,2", "--workers", "1"])
    assert res.exit_code == 2, res.output
    assert "is a directory" in res.output
