"""The HTML page and the files beside it, from real simulated runs; bad folders give one-line errors."""

import base64
import csv
import html
import io
import json
import re
import shutil

import pytest
from PIL import Image

from poolsim.reports import tables
from poolsim.reports.html import ReportError, render_comparison, render_report
from tests.reports.scenarios import write_scenario

SINGLE_RUN_FIGURES = {"memory_timeline", "queue", "prefix_cache", "latency", "fragmentation"}


def copy_run(run_dirs, name, tmp_path):
    return shutil.copytree(run_dirs[name], tmp_path / name)


def embedded_images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


def test_report_is_self_contained_and_embeds_every_png(run_dirs, tmp_path):
    out = tmp_path / "out"
    path = render_report(run_dirs["retracts"], out)
    page = path.read_text()
    pngs = {p.stem: p.read_bytes() for p in (out / "figures").glob("*.png")}
    assert set(pngs) == SINGLE_RUN_FIGURES
    assert sorted(embedded_images(page)) == sorted(pngs.values())
    for png in pngs.values():
        width, height = Image.open(io.BytesIO(png)).size
        assert width >= 1000 and height >= 300
    # nothing to fetch: no scripts, stylesheets or remote URLs; every in-page link has a target
    assert "<script" not in page and "<link" not in page
    assert not re.search(r'(src|href)="(https?:)?//', page)
    ids = set(re.findall(r' id="([^"]+)"', page))
    assert {h[1:] for h in re.findall(r'href="(#[^"]*)"', page)} <= ids
    # the data links point back into the run folder from where the page was written
    assert f'href="../../{run_dirs["retracts"].parent.name}/retracts/steps.csv"' in page


def test_page_opens_with_the_verdict_then_figures_tables_configuration_definitions(run_dirs, tmp_path):
    summary = json.loads((run_dirs["retracts"] / "summary.json").read_text())
    page = render_report(run_dirs["retracts"], tmp_path).read_text()
    order = [page.index(s) for s in (html.escape(summary["verdict"]), 'id="figures"', 'id="tables"',
                                     'id="configuration"', 'id="definitions"')]
    assert order == sorted(order)
    assert '<span class="badge does-not-fit">DOES NOT FIT</span>' in page  # it retracts and falls behind
    assert "Binding pool</a>: KV tokens ran out first, at t = 10.4 s." in page
    for text in ("test-mha-small", "H200 (test-sized pools)", "<code>--max-total-tokens</code>", "0.1.0",
                 "fixed 20 ms per step"):
        assert text in page


@pytest.mark.parametrize("scenario, state", [("fits", "fits"), ("retracts", "does-not-fit"), ("aborts", "aborts"),
                                             ("hybrid", "does-not-fit")])
def test_verdict_state(run_dirs, scenario, state):
    summary = json.loads((run_dirs[scenario] / "summary.json").read_text())
    assert tables.verdict_state(summary) == state


def test_verdict_state_prefers_aborts():
    assert tables.verdict_state({"aborted": 1, "retractions": 3}) == "aborts"
    assert tables.verdict_state({"aborted": 0, "retractions": 3}) == "retracts"
    assert tables.verdict_state({"aborted": 0, "retractions": 0}) == "fits"
    assert tables.verdict_state({"aborted": 0, "retractions": 3, "verdict_status": "does_not_fit"}) == "does-not-fit"
    assert tables.verdict_state({"aborted": 0, "retractions": 3, "verdict_status": "fits_with_retractions"}) == \
        "retracts"


def test_hybrid_report_adds_the_hybrid_figure_and_the_mamba_pool(run_dirs, tmp_path):
    page = render_report(run_dirs["hybrid"], tmp_path).read_text()
    assert {p.stem for p in (tmp_path / "figures").glob("*.png")} == SINGLE_RUN_FIGURES | {"hybrid_compare"}
    assert 'href="#m-summary-pools-mamba-capacity"' in page and "mamba state slots" in page


def test_tables_round_with_units():
    summary = {
        "verdict": "Fits.", "requests": 12_345, "finished": 12_000, "duration_s": 3725.2, "output_tok_s": 1234.5,
        "throughput_req_s": 0.7341, "cache_hit_rate": 0.4521, "prefill_tokens": 1_234_567,
        "ttft_s": {"p50": 0.0123, "p90": 0.25, "p99": 1.5, "mean": None},
        "pools": {"kv": {"capacity": 1_234_567, "peak_used_frac": 0.5, "mean_used_frac": 0.25,
                         "first_exhausted_s": None},
                  "rows": {"capacity": 512, "peak_used_frac": 1.0, "mean_used_frac": 0.9, "first_exhausted_s": 12.3}},
        "fragmentation": {"req_to_token_bytes_reserved": 36_864},
        "first_retraction": None,
    }
    t = tables.summary_tables(summary)
    groups = {g["title"]: {str(r["link"]).split(">")[1].split("<")[0]: r["value"] for r in g["rows"]}
              for g in t["groups"]}
    assert groups["Requests and throughput"] == {
        "requests": "12,345", "finished": "12,000", "duration": "3,725 s", "request throughput": "0.734 req/s",
        "output throughput": "1.23k tok/s"}
    assert groups["Prefix cache"] == {"hit rate": "45.2%", "prefill tokens computed": "1.23M"}
    assert groups["Fragmentation"] == {"req_to_token reserved": "36.0 KiB"}
    assert groups["First retraction"] == {"first retraction": "none"}
    assert [c["value"] for c in t["latency"][0]["cells"]] == ["12.3 ms", "250 ms", "1.50 s", "–"]
    assert t["pool_cols"] == ["capacity", "peak used", "mean used", "first exhausted at"]
    assert [[c["value"] for c in row["cells"]] for row in t["pools"]] == [
        ["1,234,567", "50.0%", "25.0%", "–"], ["512", "100.0%", "90.0%", "12.3 s"]]


def test_summary_csv_holds_every_summary_number(run_dirs, tmp_path):
    render_report(run_dirs["hybrid"], tmp_path)
    summary = json.loads((run_dirs["hybrid"] / "summary.json").read_text())
    with (tmp_path / "summary.csv").open() as f:
        rows = {r["metric"]: r for r in csv.DictReader(f)}
    assert rows["pools.kv.capacity"]["value"] == str(summary["pools"]["kv"]["capacity"])
    assert rows["pools.kv.capacity"]["unit"] == "tokens"
    assert float(rows["ttft_s.p99"]["value"]) == summary["ttft_s"]["p99"]
    assert rows["binding_pool"]["value"] == summary["binding_pool"]
    # nothing retracted: the fields are there, empty
    fields = ("time_s", "running", "kv_tokens_held", "pool")
    assert [rows[f"first_retraction.{k}"]["value"] for k in fields] == ["", "", "", ""]
    assert len(rows) == len(tables.flatten(summary)) - 1 + 4


def test_optional_run_json_keys_may_be_missing(run_dirs, tmp_path):
    run_dir = copy_run(run_dirs, "hybrid", tmp_path)
    (run_dir / "run.json").write_text(json.dumps({"trace": {"requests": 50}, "site": "lab-3"}))
    page = render_report(run_dir).read_text()
    assert "hybrid_compare" not in {p.stem for p in (run_dir / "figures").glob("*.png")}
    assert "lab-3" in page and "trace requests" in page
    (run_dir / "run.json").write_text("{}")
    page = render_report(run_dir).read_text()
    assert "run.json names no model, GPU, trace or seed." in page and "none recorded" in page
    assert html.escape(json.loads((run_dir / "summary.json").read_text())["verdict"]) in page


def test_report_written_by_write_runs_extra_hook(tmp_path):
    out = write_scenario("fits", tmp_path / "run", render=render_report)
    assert (out / "report.html").exists() and (out / "figures" / "queue.png").exists()
    assert 'href="steps.csv"' in (out / "report.html").read_text()
    assert not list(tmp_path.glob(".run-*"))  # the temporary folder was moved into place


def one_line_error(fn, *args) -> str:
    with pytest.raises(ReportError) as e:
        fn(*args)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_bad_folders_are_one_line_errors_naming_the_file(run_dirs, tmp_path):
    assert one_line_error(render_report, tmp_path / "nope").endswith("nope: no such run folder")
    run_dir = copy_run(run_dirs, "fits", tmp_path)
    (run_dir / "steps.csv").unlink()
    assert "missing steps.csv" in one_line_error(render_report, run_dir)

    run_dir = copy_run(run_dirs, "aborts", tmp_path)
    (run_dir / "summary.json").write_text("{not json")
    assert one_line_error(render_report, run_dir).startswith(f"{run_dir / 'summary.json'}: not valid JSON")

    run_dir = copy_run(run_dirs, "retracts", tmp_path)
    steps = (run_dir / "steps.csv").read_text().splitlines()
    header = steps[0].split(",")
    keep = [i for i, c in enumerate(header) if c not in ("evictable_size", "row_tokens")]
    (run_dir / "steps.csv").write_text("\n".join(",".join(r.split(",")[i] for i in keep) for r in steps) + "\n")
    assert one_line_error(render_report, run_dir) == (
        f"{run_dir / 'steps.csv'}: missing columns evictable_size, row_tokens")

    (run_dir / "steps.csv").write_text("")
    assert one_line_error(render_report, run_dir) == f"{run_dir / 'steps.csv'}: empty file"


def test_a_summary_without_pools_is_an_error(run_dirs, tmp_path):
    run_dir = copy_run(run_dirs, "fits", tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    del summary["pools"]["kv"]
    (run_dir / "summary.json").write_text(json.dumps(summary))
    assert one_line_error(render_report, run_dir) == f"{run_dir / 'summary.json'}: missing pools.kv.capacity"


def test_comparison_page(run_dirs, tmp_path):
    path = render_comparison([run_dirs["fits"], run_dirs["retracts"], run_dirs["hybrid"]], tmp_path)
    page = path.read_text()
    assert {p.stem for p in (tmp_path / "figures").glob("*.png")} == {
        "compare_memory", "compare_latency", "compare_throughput"}
    assert len(embedded_images(page)) == 3
    for name in ("fits", "retracts", "hybrid"):
        verdict = json.loads((run_dirs[name] / "summary.json").read_text())["verdict"]
        assert html.escape(verdict) in page
    # --max-total-tokens differs between the runs; --context-length does not
    assert re.search(r'<tr class="differs"><td><a class="metric" href="#m-run-server_args"[^>]*>--max-total-tokens',
                     page)
    assert re.search(r'<tr><td><a class="metric" href="#m-run-server_args"[^>]*>--context-length', page)
    with (tmp_path / "comparison.csv").open() as f:
        rows = {r["metric"]: r for r in csv.DictReader(f)}
    assert list(rows["pools.kv.capacity"].values()) == ["pools.kv.capacity", "tokens", "4096", "1400", "2400"]
    assert rows["pools.mamba.capacity"]["fits"] == "" and rows["pools.mamba.capacity"]["hybrid"] == "20"
    ids = set(re.findall(r' id="([^"]+)"', page))
    assert {h[1:] for h in re.findall(r'href="(#[^"]*)"', page)} <= ids


def test_comparison_needs_two_runs(run_dirs, tmp_path):
    assert one_line_error(render_comparison, [run_dirs["fits"]], tmp_path) == (
        "a comparison needs at least two run folders")


def test_the_deciding_numbers_stand_next_to_the_verdict(run_dirs, tmp_path):
    """The retracts scenario falls behind: the verdict's box shows the admission wait, the backlog and the
    rates it was decided on, each linked to its definition."""
    summary = json.loads((run_dirs["retracts"] / "summary.json").read_text())
    page = render_report(run_dirs["retracts"], tmp_path).read_text()
    box = page[page.index('<div class="verdict'):page.index("</div>", page.index('<ul>'))]
    assert "Deciding numbers:" in box and 'href="#m-summary-queue_wait_s-p50"' in box
    assert f"{summary['backlog_at_last_arrival']} of {summary['requests']}" in box
    assert summary["verdict_failures"] == "cannot_keep_up"


def test_a_garbage_value_or_a_cut_table_is_a_one_line_error_naming_file_and_line(run_dirs, tmp_path):
    run_dir = copy_run(run_dirs, "fits", tmp_path)
    path = run_dir / "requests.csv"
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    row = lines[3].split(",")  # the file's line 4: the third request
    row[header.index("output_len")] = "garbage"
    lines[3] = ",".join(row)
    path.write_text("\n".join(lines) + "\n")
    assert one_line_error(render_report, run_dir) == f"{path}: line 4: column 'output_len': 'garbage' is not a number"

    run_dir = copy_run(run_dirs, "fits", tmp_path / "cut")
    steps = (run_dir / "steps.csv").read_text().splitlines()
    n = json.loads((run_dir / "summary.json").read_text())["steps"]
    assert len(steps) == n + 1 > 3
    (run_dir / "steps.csv").write_text("\n".join(steps[:3]) + "\n")
    assert one_line_error(render_report, run_dir) == (
        f"{run_dir / 'steps.csv'}: 2 rows, but summary.json counts {n:,} steps: the file is cut short or belongs to "
        "another run")


def test_the_title_names_the_gpu_count_and_parallelism_and_only_flags_that_apply(run_dirs, tmp_path):
    from poolsim.reports.html import _title
    from poolsim.reports.tables import configuration

    run = {"model": "llama-3.1-70b", "gpu": "H100 80GB SXM", "server_args": {"tp_size": 8, "dp_size": 1}}
    assert _title(run, "x") == "llama-3.1-70b on 8x H100 80GB SXM (tp 8)"
    run["server_args"] = {"tp_size": 2, "dp_size": 4}
    assert _title(run, "x") == "llama-3.1-70b on 8x H100 80GB SXM (tp 2, dp 4)"
    run["server_args"] = {"tp_size": 1, "dp_size": 1}
    assert _title(run, "x") == "llama-3.1-70b on H100 80GB SXM"
    dense = {"server_args": {"tp_size": 1, "mamba_track_interval": 256, "swa_full_tokens_ratio": 0.8},
             "memory_plan": {"mamba": None, "swa_pool": None, "sliding_window": None, "kv_size_gib": None,
                             "max_total_num_tokens": 1000}}
    c = configuration(dense)
    assert [f["flag"] for f in c["flags"]] == ["--tp-size"]
    assert [r["raw"] for r in c["plan"]] == ["1000"]  # the None fields (no SWA, no mamba, no MLA) are not rows
    hybrid = {**dense, "memory_plan": {**dense["memory_plan"], "mamba": {"max_mamba_cache_size": 10}}}
    assert [f["flag"] for f in configuration(hybrid)["flags"]] == ["--tp-size", "--mamba-track-interval"]


def test_a_binary_summary_is_a_one_line_error_not_a_codec_error(run_dirs, tmp_path):
    run_dir = copy_run(run_dirs, "fits", tmp_path)
    (run_dir / "summary.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe binary")
    assert one_line_error(render_report, run_dir) == (
        f"{run_dir / 'summary.json'}: not a text file (binary content where JSON belongs)")
