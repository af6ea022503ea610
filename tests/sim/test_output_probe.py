"""An --out whose parent refuses writes is refused before the simulation, also for root (os.access says yes to
root everywhere; a write probe does not lie): /proc refuses every new entry."""

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from poolsim.app.output import OutputError, check_out_dir
from poolsim.cli import app

pytestmark = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")


def test_a_parent_that_refuses_new_entries_is_refused_up_front():
    with pytest.raises(OutputError, match=r"^/proc/poolsim-run: cannot write in /proc \("):
        check_out_dir("/proc/poolsim-run")


def test_run_refuses_it_before_simulating(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 100, "output_length": 3, "hash_ids": [0]}\n')
    res = CliRunner().invoke(app, ["run", str(trace), "--model", "llama-3.1-8b", "--gpu", "H100", "--quiet",
                                   "--out", "/proc/poolsim-run"])
    assert res.exit_code == 2
    assert res.output.startswith("error: /proc/poolsim-run: cannot write in /proc (") and "simulating" not in res.output
    assert not [p for p in os.listdir("/proc") if p.startswith(".")]  # the probe left nothing
