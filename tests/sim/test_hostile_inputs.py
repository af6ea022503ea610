"""Hostile inputs: each is one line naming the flag, field or file the user gave, exit code 2, no traceback, and
nothing written. One case per report of the hostile-input review."""

import json

import pytest
from typer.testing import CliRunner

from poolsim.cli import app

runner = CliRunner()
PLAN = ["plan", "--model", "llama-3.1-8b", "--gpu", "H100"]
KIMI = ["--model", "kimi-linear-48b-a3b", "--gpu", "H200"]

CASES = [
    (["run", *KIMI, "--mamba-track-interval", "0"], "--mamba-track-interval 0: must be a whole number >= 1"),
    (["bench", *KIMI, "--mamba-track-interval", "0", "--dataset-name", "random-ids", "--num-prompts", "2"],
     "--mamba-track-interval 0: must be a whole number >= 1"),
    (["plan", "--model", "llama-3.1-8b", "--gpu-memory-gib", "inf"], "--gpu-memory-gib inf: a custom GPU needs a"),
    (["plan", "--model", "llama-3.1-8b", "--gpu-memory-gib", "nan"], "--gpu-memory-gib nan: a custom GPU needs a"),
    (["plan", "--model", "llama-3.1-8b", "--gpu-memory-gib", "1e12"], "--gpu-memory-gib 1e+12: more than any"),
    (["plan", "--model", "llama-3.1-8b", "--gpu-memory-gib", "80", "--gpu-bandwidth-tbs", "0"],
     "--gpu-bandwidth-tbs 0: a custom GPU needs a finite number > 0"),
    ([*PLAN, "--runtime-overhead-gib", "-50"], "--runtime-overhead-gib -50: must be a finite number of GiB >= 0"),
    ([*PLAN, "--schedule-conservativeness", "-1"], "--schedule-conservativeness -1: must be a finite number > 0"),
    ([*PLAN, "--scheduler-recv-interval", "0"], "--scheduler-recv-interval 0: must be a whole number >= 1"),
    ([*PLAN, "--max-prefill-tokens", "0"], "--max-prefill-tokens 0: must be a whole number >= 1"),
    ([*PLAN, "--chunked-prefill-size", "0"], "--chunked-prefill-size 0: must be >= 1, or -1 to disable chunking"),
    ([*PLAN, "--mem-fraction-static", "1.5"], "--mem-fraction-static 1.5: must be a fraction between 0 and 1"),
    (["bench", "--model", "llama-3.1-8b", "--gpu", "H100", "--dataset-name", "random-ids", "--num-prompts", "2",
      "--tokenizer-vocab-size", "0"], "--tokenizer-vocab-size 0: must be >= 1"),
    (["sweep", "--model", "llama-3.1-8b", "--grid", "gpu=H100", "--gpu-cost", "H100=-2"],
     "--gpu-cost 'H100=-2': expected GPU=PRICE with a price >= 0"),
    (["sweep", "--model", "llama-3.1-8b", "--grid", "gpu=H100", "--slo-p99-s", "-1"], "--slo-p99-s"),
    (["run", "--model", "llama-3.1-8b", "--gpu", "H100", "--slo-p99-s", "-1"],
     "--slo-p99-s -1: expected a positive number of seconds"),
    (["sweep", "--model", "llama-3.1-8b", "--grid", "gpu=H100", "--workers", "-2"], "--workers -2: must be >= 1"),
    (["sweep", "--model", "llama-3.1-8b", "--grid", "gpu=H100", "--grid", "gpu=H200"], "gpu is given twice"),
    (["run", "--model", "llama-3.1-8b", "--gpu", "H100", "--compare-model", "nope"],
     "--compare-model 'nope' is neither a config.json nor a catalog name"),
    (["plan", *KIMI, "--compare", "--against", "nope"], "--against 'nope' is neither a config.json"),
]


@pytest.mark.parametrize("args, expected", CASES, ids=[" ".join(a[:1] + a[-2:]) for a, _ in CASES])
def test_a_bad_number_is_one_line_naming_the_flag(args, expected):
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and expected in errors[0], res.output
    assert "Traceback" not in res.output and "simulating" not in res.output  # refused before any simulation


def test_a_custom_gpu_says_what_it_assumed(tmp_path):
    res = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--gpu-memory-gib", "80", "--json"])
    assert res.exit_code == 0
    warned = [line for line in res.stderr.splitlines() if line.startswith("WARNING custom GPU")]
    assert [w.split(";")[0] for w in warned] == [
        "WARNING custom GPU: --gpu-bandwidth-tbs not given", "WARNING custom GPU: --gpu-bf16-tflops not given",
        "WARNING custom GPU: --gpu-arch not given"]
    assert "assumed 3.35 TB/s, an H100 80GB SXM's (datasheet)" in warned[0]
    quiet = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--gpu-memory-gib", "80", "--gpu-bandwidth-tbs",
                                "2", "--gpu-bf16-tflops", "400", "--gpu-arch", "sm80", "--json"])
    assert quiet.exit_code == 0 and "WARNING" not in quiet.stderr


def test_a_nan_calibration_gets_no_verdict(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text('{"coefficients": {"mfu_sm90": NaN}}')
    res = runner.invoke(app, ["run", "--model", "llama-3.1-8b", "--gpu", "H100", "--calibration", str(path)])
    assert res.exit_code == 2 and "must be finite positive numbers" in res.output and "FITS" not in res.output


@pytest.mark.parametrize("config_change, expected", [
    ({"num_key_value_heads": 5}, "field 'num_key_value_heads' 5 does not divide 'num_attention_heads' 32"),
    ({"hidden_size": 4097}, "field 'hidden_size' 4097 is not divisible by 'num_attention_heads' 32"),
])
def test_a_config_whose_heads_do_not_divide_is_refused(tmp_path, config_change, expected):
    from poolsim.pools.model.config import CATALOG_DIR

    cfg = json.loads((CATALOG_DIR / "llama-3.1-8b.json").read_text())
    cfg.pop("head_dim", None)
    cfg.update(config_change)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    res = runner.invoke(app, ["plan", "--model", str(path), "--gpu", "H100"])
    assert res.exit_code == 2 and expected in res.output and str(path) in res.output


def test_a_trace_command_never_writes_a_trace_with_no_request(tmp_path):
    from poolsim.traces import DEFAULT_TRACE

    out = tmp_path / "t.jsonl"
    res = runner.invoke(app, ["trace", "generate", str(out), "--sessions", "0"])
    assert res.exit_code == 2 and "--sessions 0: must be >= 1" in res.output and not out.exists()
    res = runner.invoke(app, ["trace", "slice", str(DEFAULT_TRACE), str(out), "--start", "1e6", "--end", "2e6"])
    assert res.exit_code == 2 and "has no request arriving in [1e+06 s, 2e+06 s); nothing written" in res.output
    assert not out.exists() and list(tmp_path.iterdir()) == []
    res = runner.invoke(app, ["trace", "slice", str(DEFAULT_TRACE), str(out), "--start", "-5"])
    assert res.exit_code == 2 and "--start -5 --end inf: need 0 <= --start < --end" in res.output
    res = runner.invoke(app, ["trace", "generate", str(out), "--sessions", "2", "--max-new-tokens", "0"])
    assert res.exit_code == 2 and "--max-new-tokens 0: must be >= 1" in res.output


def test_a_bad_grid_value_is_that_rows_error_not_the_sweeps_end():
    res = runner.invoke(app, ["sweep", *KIMI, "--grid", "mamba_track_interval=0,256", "--workers", "1", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["mamba_track_interval"]: r for r in json.loads(res.stdout)["configs"]}
    assert rows[0]["error"] == "--mamba-track-interval 0: must be a whole number >= 1"
    assert rows[256]["error"] == "" and rows[256]["throughput_tok_s"] > 0


def test_does_not_fit_names_the_smallest_change_that_fits(tmp_path):
    """Llama-3.1-70B on 4 H100s cannot keep up with the Mooncake head: the search tries dp x2, tp x2, the H200, dp
    x4 in that order and names the first that fits, in the console, run.json and the report."""
    from pathlib import Path

    from poolsim.app.suggest import _larger_gpu, candidates
    from poolsim.pools.hardware.gpu_catalog import get_gpu
    from poolsim.pools.sizing.server_args import ServerArgs

    assert [f for f, _, _ in candidates(get_gpu("H100"), ServerArgs(tp_size=4))] == [
        {"--dp": 2}, {"--tp": 8}, {"--gpu": "H200"}, {"--dp": 4}]
    assert _larger_gpu(get_gpu("H100"))[0] == "h200"  # not the A100 80GB: a few MiB more, but slower
    assert _larger_gpu(get_gpu("MI300X")) is None
    trace = Path(__file__).parents[1] / "traces" / "data" / "mooncake_conversation_head400.jsonl"
    out = tmp_path / "r"
    res = runner.invoke(app, ["run", str(trace), "--model", "llama-3.1-70b", "--gpu", "H100", "--tp", "4", "--quiet",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    run = json.loads((out / "run.json").read_text())
    fit = run["would_fit"]
    assert fit["tried"][-1] == " ".join(f"{k} {v}" for k, v in fit["flags"].items())  # the first that fit, last tried
    assert fit["verdict_status"] != "does_not_fit" and fit["command"].endswith(fit["tried"][-1])
    assert f"would fit: {fit['command']}" in res.output
    assert "What would fit</a>: <code>" in (out / "report.html").read_text()
    res = runner.invoke(app, ["run", str(trace), "--model", "llama-3.1-70b", "--gpu", "H100", "--tp", "4", "--quiet",
                              "--no-suggest", "--json"])
    assert res.exit_code == 0 and "would fit" not in res.output
