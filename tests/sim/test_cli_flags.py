"""The command line a new user meets: flags, help, exit codes, --json everywhere."""

import json

import pytest
import typer.main
from typer.testing import CliRunner

from poolsim.cli import SERVER_OPTIONS, app
from poolsim.pools.hardware.gpu_catalog import GPU_CATALOG
from poolsim.pools.model.config import ModelConfig
from poolsim.traces import DEFAULT_TRACE, load_trace, slice_trace, write_trace

runner = CliRunner()
SERVER = ["--model", "llama-3.1-8b", "--gpu", "H100"]


def test_version_flag_and_command_agree():
    flag, command = runner.invoke(app, ["--version"]), runner.invoke(app, ["version"])
    assert flag.exit_code == command.exit_code == 0 and flag.stdout == command.stdout != ""


def test_sglang_names_and_report_flags_are_accepted(tmp_path):
    trace = tmp_path / "t.jsonl"
    write_trace(slice_trace(load_trace(DEFAULT_TRACE), 0, 5), trace)
    res = runner.invoke(app, ["run", str(trace), "--model-path", "qwen3-8b", "--gpu", "H100", "--disable-cuda-graph",
                              "--mamba-track-interval", "128", "--out", str(tmp_path / "o"), "--quiet"])
    assert res.exit_code == 0, res.output
    args = json.loads((tmp_path / "o" / "run.json").read_text())["server_args"]
    assert (args["disable_cuda_graph"], args["mamba_track_interval"]) == (True, 128)


def test_an_unknown_router_is_rejected_with_the_choices():
    res = runner.invoke(app, ["run", *SERVER, "--router", "random"])
    assert res.exit_code == 2
    assert res.output == "error: --router 'random': expected one of round_robin, cache_aware\n"


def test_max_total_tokens_leaving_no_row_is_one_rule_for_plan_and_run():
    # resolve_max_num_reqs: min(rows, max_total_num_tokens // 2) = 1 // 2 = 0 rows
    line = "error: --max-total-tokens 1: 1 KV tokens give 1 // 2 = 0 request rows; a server needs at least one\n"
    for cmd in ("plan", "run"):
        res = runner.invoke(app, [cmd, *SERVER, "--max-total-tokens", "1"])
        assert (res.exit_code, res.output) == (2, line), cmd
    res = runner.invoke(app, ["plan", *SERVER, "--max-total-tokens", "2", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["max_running_requests"] == 1


def test_plan_logs_the_clamp_of_max_total_tokens_as_sglang_does():
    res = runner.invoke(app, ["plan", *SERVER, "--max-total-tokens", "500000", "--json"])
    assert res.exit_code == 0
    assert res.stderr == ("WARNING max_total_tokens=500000 is larger than the profiled value 410724. "
                          "Use the profiled value instead.\n")
    assert json.loads(res.stdout)["max_total_num_tokens"] == 410724


def test_models_and_gpus_json():
    models = json.loads(runner.invoke(app, ["models", "--json"]).stdout)
    assert [m["name"] for m in models] == ModelConfig.catalog_names()
    llama = next(m for m in models if m["name"] == "llama-3.1-8b")
    assert (llama["layers"], llama["attention_arch"], llama["linear_layers"]) == (32, "mha", 0)
    gpus = json.loads(runner.invoke(app, ["gpus", "--json"]).stdout)
    assert [g["key"] for g in gpus] == list(GPU_CATALOG)
    h100 = next(g for g in gpus if g["key"] == "h100")
    assert (h100["memory_bytes"], h100["arch"]) == (GPU_CATALOG["h100"].total_bytes, "sm90")


def _commands(command, path=()):
    yield list(path)
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


@pytest.mark.parametrize("path", list(_commands(typer.main.get_command(app))), ids=" ".join)
def test_help_fits_80_columns_without_cutting(path):
    res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert res.exit_code == 0
    assert max(len(line) for line in res.output.splitlines()) <= 80
    assert "…" not in res.output, res.output


def test_every_sglang_flag_has_one_line_of_help():
    assert all(opt.help for _, opt in SERVER_OPTIONS.values())


def test_the_readme_max_total_tokens_example_is_not_clamped():
    import re
    import shlex
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    line = next(x for x in readme.splitlines() if "poolsim plan" in x and "--max-total-tokens" in x)
    argv = shlex.split(line.split("#")[0])[1:]
    res = runner.invoke(app, argv)
    asked = int(re.search(r"--max-total-tokens (\d+)", line)[1])
    assert res.exit_code == 0 and res.stderr == "" and json.loads(res.stdout)["max_total_num_tokens"] == asked


@pytest.mark.parametrize("cmd", ["run", "bench"])
def test_a_calibration_with_a_fixed_step_time_is_rejected_naming_both_flags(cmd, tmp_path):
    """A calibration sets the analytic model's coefficients; a fixed step time would silently ignore it. Refused
    before anything runs (the file need not even exist) and nothing is written under --out."""
    out = tmp_path / "out"
    extra = ["--out", str(out)] if cmd == "run" else []
    res = runner.invoke(app, [cmd, *SERVER, "--calibration", "cal.json", "--step-time", "fixed:20", *extra])
    assert res.exit_code == 2
    assert res.output == ("error: --calibration cal.json has no effect with --step-time fixed:20: a calibration "
                          "sets the analytic model's coefficients; drop one of the two flags\n")
    assert not out.exists()


def test_every_server_args_field_is_a_flag_with_the_fields_default():
    """The SGLang flags are generated from pools.sizing.server_args.SERVER_FLAGS: one per field, in --help order,
    its default SGLang's (the field's; None: SGLang picks)."""
    from dataclasses import fields

    from poolsim.pools.sizing.server_args import SERVER_FLAGS, ServerArgs

    assert sorted(f.field for f in SERVER_FLAGS) == sorted(f.name for f in fields(ServerArgs))
    for f in fields(ServerArgs):
        assert SERVER_OPTIONS[f.name][1].default == f.default, f.name
    assert list(SERVER_OPTIONS)[:4] == ["model", "gpu", "tp_size", "dp_size"]
