"""`poolsim run` as a user drives it: output, files, comparisons, and one-line errors for bad input."""

import json

from typer.testing import CliRunner

from poolsim.cli import app
from tests import helpers

runner = CliRunner()


def small_trace(tmp_path):
    return helpers.small_trace(tmp_path, 60)


def test_run_json_has_the_summary(tmp_path):
    res = runner.invoke(app, ["run", str(small_trace(tmp_path)), "--model", "llama-3.1-8b", "--gpu", "H100",
                              "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["finished"] == summary["requests"] > 0
    assert {"ttft_s", "itl_s", "e2e_s", "cache_hit_rate", "pools", "binding_pool", "verdict"} <= summary.keys()


def test_run_writes_frames_summary_and_report(tmp_path):
    out = tmp_path / "out"
    res = runner.invoke(app, ["run", str(small_trace(tmp_path)), "--model", "qwen3-8b", "--gpu", "H100",
                              "--page-size", "16", "--disable-overlap-schedule", "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert {"steps.csv", "requests.csv", "summary.json", "run.json", "report.html"} <= {p.name for p in out.iterdir()}
    run = json.loads((out / "run.json").read_text())
    assert run["server_args"]["page_size"] == 16 and run["overlap_schedule"] is False
    assert run["memory_plan"]["page_size"] == 16
    assert "FITS:" in res.output
    # which time model ran, and its measured error, on the terminal and in the report
    assert "time model: analytic roofline (fitted defaults; held-out median |error|" in res.output
    assert run["step_time_model"].startswith("analytic roofline (fitted defaults; held-out median |error|")
    assert "held-out median |error|" in (out / "report.html").read_text()
    # no published H100/H200 run was fitted: the line says the sm90 terms are still the priors
    assert "the sm90 terms are priors: no published run on sm90 was fitted" in run["step_time_model"]


def test_run_names_the_calibration_file_it_used(tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-30",
                               "coefficients": {"hbm_efficiency_sm90": 0.8}}))
    res = runner.invoke(app, ["run", str(small_trace(tmp_path)), "--model", "llama-3.1-8b", "--gpu", "H100",
                              "--calibration", str(cal), "--quiet"])
    assert res.exit_code == 0, res.output
    assert f"time model: analytic roofline (calibration {cal} (NVIDIA H100 80GB HBM3, 2026-11-30)" in res.output
    assert "HBM efficiency 0.8" in res.output
    res = runner.invoke(app, ["run", str(small_trace(tmp_path)), "--model", "llama-3.1-8b", "--gpu", "H100",
                              "--step-time", "fixed:20", "--quiet"])
    assert "time model: fixed 20 ms per step" in res.output


def test_compare_model_runs_both_side_by_side(tmp_path):
    res = runner.invoke(app, ["run", str(small_trace(tmp_path)), "--model", "kimi-linear-48b-a3b", "--gpu", "H200",
                              "--compare-model", "llama-3.1-70b", "--compare-tp", "2", "--json"])
    assert res.exit_code == 0, res.output
    both = json.loads(res.output)
    assert set(both) == {"kimi-linear-48b-a3b tp1", "llama-3.1-70b tp2"}
    assert "mamba" in both["kimi-linear-48b-a3b tp1"]["pools"]
    assert "mamba" not in both["llama-3.1-70b tp2"]["pools"]


def test_bad_input_is_one_line_and_nonzero(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
                   '{"timestamp": 5, "input_length": -3, "output_length": 5, "hash_ids": []}\n')
    for args in (["run", str(bad)], ["run", str(tmp_path / "missing.jsonl")], ["run", "--model", "nosuch"],
                 ["run", "--page-size", "3"], ["run", "--max-new-tokens-policy", "fixed:x"],
                 ["run", "--step-time", "warp"], ["run", "--dp", "0"]):
        argv = args + ["--gpu", "H100"] + ([] if "--model" in args else ["--model", "llama-3.1-8b"])
        res = runner.invoke(app, argv)
        assert res.exit_code == 2, (argv, res.output)
        lines = [line for line in res.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, res.output)
    out = tmp_path / "never"
    res = runner.invoke(app, ["run", str(bad), "--model", "llama-3.1-8b", "--gpu", "H100", "--out", str(out)])
    assert res.exit_code == 2 and not out.exists()  # nothing half-written
    assert "bad.jsonl:2: field 'input_length'" in res.output
    res = runner.invoke(app, ["run", str(bad), "--model", "llama-3.1-8b", "--gpu", "H100", "--skip-bad-lines",
                              "--quiet"])
    assert res.exit_code == 0 and "skipped 1 malformed trace lines" in res.output


def test_a_model_that_cannot_fit_is_refused():
    res = runner.invoke(app, ["run", "--model", "kimi-linear-48b-a3b", "--gpu", "H100"])
    assert res.exit_code == 2
    assert "weights need 91.55 GiB per rank" in res.output


def test_context_length_10_aborts_everything_and_says_why(tmp_path):
    """max_req_input_len = min(10 - 1, pool - 1) - 5 = 4: every prompt of the small trace is longer."""
    res = runner.invoke(app, ["run", str(small_trace(tmp_path)), "--model", "llama-3.1-8b", "--gpu", "H100",
                              "--context-length", "10", "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    assert s["aborted"] == s["requests"] == s["abort_causes"]["input_too_long"]
    assert s["verdict"].startswith(f"DOES NOT FIT: {s['requests']} of {s['requests']} requests aborted "
                                   f"({s['requests']} with a prompt too long")


def test_run_accepts_an_slo(tmp_path):
    res = runner.invoke(app, ["run", str(small_trace(tmp_path)), "--model", "llama-3.1-8b", "--gpu", "H100",
                              "--slo-p99-s", "0.000001", "--slo-on", "ttft", "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    assert (s["slo_on"], s["verdict_status"], s["verdict_failures"]) == ("ttft", "does_not_fit", "slo_missed")
    bad = runner.invoke(app, ["run", str(small_trace(tmp_path)), "--model", "llama-3.1-8b", "--gpu", "H100",
                              "--slo-on", "itl"])
    assert bad.exit_code == 2 and "--slo-on 'itl'" in bad.output


def test_compare_table_gives_each_server_its_own_capacities_and_aligns_rows_by_name(tmp_path):
    """Side by side, a pool row shows each server's own capacity (Kimi-Linear on an H200: 2,432,131 KV tokens, 81
    rows, 405 mamba slots, as `plan` sizes it), and a row only one server has (mamba slots) is '-' for the other
    instead of shifting the rows below it."""
    trace = str(small_trace(tmp_path))
    args = ["run", trace, "--model", "kimi-linear-48b-a3b", "--gpu", "H200", "--compare-model", "llama-3.1-70b",
            "--compare-tp", "2"]
    llama = json.loads(runner.invoke(app, args + ["--json"]).output)["llama-3.1-70b tp2"]["pools"]
    res = runner.invoke(app, args + ["--quiet"], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    rows = {line.split("  ")[0].strip(): line for line in res.output.splitlines() if line.startswith(" ")}
    kv, req, mamba = rows["KV tokens"], rows["request rows"], rows["mamba slots"]
    assert "capacity 2,432,131: peak" in kv and f"capacity {llama['kv']['capacity']:,}: peak" in kv
    assert "capacity 81: peak" in req and f"capacity {llama['rows']['capacity']:,}: peak" in req
    assert "capacity 405: peak" in mamba and mamba.rstrip().endswith(" -")


def test_cli_latencies_read_as_the_report_prints_them():
    """The terminal summary and report.html show a latency the same way (three significant digits): an 8.49 ms
    inter-token latency was '8 ms' on the terminal and '8.49 ms' in the report."""
    from poolsim.cli import _summary_rows
    lat = {"p50": 0.00849, "p90": 0.131, "p99": 5.5003, "mean": 0.1}
    summary = {"finished": 3, "aborted": 0, "retractions": 0, "retracted_requests": 0, "duration_s": 1.0,
               "steps": 4, "throughput_req_s": 3.0, "output_tok_s": 1.0, "input_tok_s": 1.0, "ttft_s": lat,
               "itl_s": lat, "e2e_s": {k: None for k in lat}, "cache_hit_rate": 0.0, "pools": {}}
    rows = dict(_summary_rows(summary))
    assert rows["TTFT p50 / p90 / p99"] == "8.49 ms / 131 ms / 5.50 s"
    assert rows["end-to-end p50 / p90 / p99"] == "- / - / -"


def _count_plans(monkeypatch):
    """plan_memory's calls, by model name, wherever the CLI and app modules reach it."""
    import poolsim.app.plan
    import poolsim.app.run
    import poolsim.pools.sizing.plan as sizing

    calls, real = [], sizing.plan_memory

    def counted(model, *args, **kw):
        calls.append(model.name)
        return real(model, *args, **kw)

    for module in (sizing, poolsim.app.run, poolsim.app.plan):
        monkeypatch.setattr(module, "plan_memory", counted)
    return calls


def test_run_and_plan_compare_size_each_configuration_once(tmp_path, monkeypatch):
    calls = _count_plans(monkeypatch)
    trace = str(small_trace(tmp_path))
    res = runner.invoke(app, ["run", trace, "--model", "llama-3.1-8b", "--gpu", "H200",
                              "--compare-model", "kimi-linear-48b-a3b", "--quiet"])
    assert res.exit_code == 0, res.output
    # the hybrid's all-full-attention twin (run.json's hybrid_compare) is a configuration of its own
    assert calls == ["llama-3.1-8b", "kimi-linear-48b-a3b", "kimi-linear-48b-a3b (all MLA)"]
    calls.clear()
    res = runner.invoke(app, ["plan", "--model", "kimi-linear-48b-a3b", "--gpu", "H200", "--compare",
                              "--against", "llama-3.1-8b", "--json"])
    assert res.exit_code == 0, res.output
    assert calls == ["kimi-linear-48b-a3b", "kimi-linear-48b-a3b (all MLA)", "llama-3.1-8b"]


def test_run_hybrid_compare_is_plan_compares_rows(tmp_path):
    """One comparison for both commands: run.json's hybrid_compare holds plan --compare's numbers."""
    out = tmp_path / "o"
    args = ["--model", "kimi-linear-48b-a3b", "--gpu", "H200", "--context-length", "65536"]
    res = runner.invoke(app, ["run", str(small_trace(tmp_path)), *args, "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    hybrid = json.loads((out / "run.json").read_text())["hybrid_compare"]
    res = runner.invoke(app, ["plan", *args, "--compare", "--json"])
    compare = json.loads(res.stdout)["compare"]
    rows = {(r["model"], r["context_len"]): r for r in compare["records"]}
    for i, n in enumerate(hybrid["context_len"]):
        if ("kimi-linear-48b-a3b", n) in rows:
            assert hybrid["hybrid_bytes_per_request"][i] == rows["kimi-linear-48b-a3b", n]["bytes_per_request"]
            assert hybrid["full_attn_max_concurrency"][i] == rows[hybrid["full_attn_model"], n]["max_concurrency"]
    assert hybrid["crossover_context_len"] == compare["crossover_context_len"]
