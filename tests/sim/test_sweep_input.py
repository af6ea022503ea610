"""A sweep's bad trace is bad input for the whole command: one line, exit 2, before any configuration runs."""

from typer.testing import CliRunner

from poolsim.cli import app


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


def test_sweep_table_prints_counts_as_integers_beside_an_error_row(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 100, "output_length": 3, "hash_ids": [0]}\n')
    res = CliRunner().invoke(app, ["sweep", str(trace), "--model", "llama-3.1-8b", "--gpu", "H100", "--grid",
                                   "tp=1,3", "--workers", "1"])
    assert res.exit_code == 0, res.output
    rows = {line.split()[0]: line.split() for line in res.output.splitlines()[1:] if line.strip()}
    gpus, *_, retractions, aborted = rows["tp=1"][1:7]  # label, gpus, throughput, p99 ttft, p99, retr., aborted
    assert (gpus, retractions, aborted) == ("1", "0", "0")  # counts, not 1.00 / 0.00
    assert rows["tp=3"][1] == "-"  # the refused configuration has no numbers, not NaN
