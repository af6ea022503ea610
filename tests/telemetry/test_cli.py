"""poolsim record / calibrate --measured / validate --measured through the CLI."""

import json
import threading

import pytest
from typer.testing import CliRunner

from poolsim.cli import app
from poolsim.kernels import calibrate as cal
from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.server_args import ServerArgs
from poolsim.telemetry.synthetic import synthetic_stream, write_jsonl
from poolsim.traces.bench_serving import bench_requests
from tests.telemetry.samples import bench_result, decode_0523, fpm, write_lines

runner = CliRunner()
SERVER = ["--model", "llama-3.1-8b", "--gpu", "h200"]


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    model, gpu, args = ModelConfig.load("llama-3.1-8b"), get_gpu("h200"), ServerArgs()
    trace = bench_requests("random-ids", 40, input_len=1024, output_len=48, range_ratio=0.2, request_rate=8.0,
                           vocab_size=model.vocab_size, seed=2)
    truth = cal.synthetic_truth(["hbm_efficiency_sm90", "mfu_sm90"])
    path = tmp_path_factory.mktemp("fpm") / "fpm.jsonl"
    write_jsonl(synthetic_stream(trace, model, gpu, args, truth, noise=0.03, seed=3), path)
    return path


def test_calibrate_then_validate_measured(stream, tmp_path):
    out = tmp_path / "cal"
    r = runner.invoke(app, ["calibrate", "--measured", str(stream), *SERVER, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "fit (sm90): hbm_efficiency_sm90" in r.output and "held-out (" in r.output
    assert f"wrote {out}/calibration.json" in r.output
    bench = write_lines(tmp_path / "bench.jsonl", [bench_result()])
    log = write_lines(tmp_path / "server.log", [decode_0523(10, 8, 9000, 800.0), decode_0523(11, 8, 9320, 790.0)])
    r = runner.invoke(app, ["validate", "--measured", str(stream), "--measured", log, "--measured", bench, *SERVER,
                            "--calibration", str(out / "calibration.json"), "--json"])
    assert r.exit_code == 0, r.output
    v = json.loads(r.output)
    assert v["steps"] > 100 and set(v["step_time_error_pct"]) == {"median_abs", "p90_abs", "median_signed"}
    assert set(v["by_kind"]) == {"decode", "prefill", "mixed"}
    assert v["skipped"]["server-log: first interval"] == 1
    assert v["step_time_error_pct"]["median_abs"] < 5
    (run,) = v["runs"]
    assert run["metrics"]["median_ttft_ms"]["measured"] == 40.0 and "error_pct" in run["metrics"]["mean_tpot_ms"]
    r = runner.invoke(app, ["validate", "--measured", str(stream), "--measured", bench, *SERVER])
    assert r.exit_code == 0, r.output
    assert "median |err|" in r.output and "median_ttft_ms" in r.output


def test_measured_errors_are_one_line(tmp_path):
    bad = write_lines(tmp_path / "bad.jsonl", [fpm(0, 0.01, n_d=1, kv=4), {"wall_time": 1, "scheduled_requests": {}}])
    r = runner.invoke(app, ["calibrate", "--measured", bad, *SERVER, "--out", str(tmp_path / "c")])
    assert r.exit_code == 2 and r.output.strip().count("\n") == 0
    assert f"{bad}:2: field 'version': missing" in r.output
    bench = write_lines(tmp_path / "b.jsonl", [bench_result()])
    r = runner.invoke(app, ["calibrate", "--measured", bench, *SERVER, "--out", str(tmp_path / "c")])
    assert r.exit_code == 2 and "poolsim validate --measured" in r.output
    r = runner.invoke(app, ["validate", *SERVER])
    assert r.exit_code == 2 and "--calibration is required" in r.output


def test_record_command(tmp_path):
    zmq = pytest.importorskip("zmq")
    msgspec = pytest.importorskip("msgspec")
    endpoint = f"ipc://{tmp_path}/fpm.0"
    ready = threading.Event()

    def publish():
        ctx = zmq.Context()
        pub = ctx.socket(zmq.XPUB)
        pub.bind(endpoint)
        ready.set()
        if pub.poll(10_000):
            pub.recv()
            for i in range(3):
                msg = [1, "", 0, i, 0.01, [0, 0, 0.0, 0, 4, 4000, 0.0], [0, 0, 0.0, 0, 0, 0.0]]
                pub.send_multipart([b"", i.to_bytes(8, "big"), msgspec.msgpack.encode(msg)])
        pub.close(linger=1000)
        ctx.term()

    t = threading.Thread(target=publish, daemon=True)
    t.start()
    ready.wait(5)
    out = tmp_path / "fpm.jsonl"
    r = runner.invoke(app, ["record", "--fpm", endpoint, "--out", str(out), "--max-messages", "3",
                            "--duration", "20"])
    t.join(10)
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"wrote 3 messages to {out}")
    assert [json.loads(x)["counter_id"] for x in out.read_text().splitlines()] == [0, 1, 2]


def test_validate_measured_out_writes_the_page(stream, tmp_path):
    import csv

    bench = write_lines(tmp_path / "bench.jsonl", [bench_result(details=True)])
    log = write_lines(tmp_path / "server.log", [decode_0523(10, 8, 9000, 800.0), decode_0523(11, 8, 9320, 790.0)])
    out = tmp_path / "val"
    args = ["validate", "--measured", str(stream), "--measured", log, "--measured", bench, *SERVER]
    r = runner.invoke(app, [*args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert r.output.rstrip().endswith(f"wrote {out / 'validation.html'}")
    assert sorted(p.name for p in out.iterdir()) == ["steps.csv", "validation.html", "validation.json"]
    saved = json.loads((out / "validation.json").read_text())
    printed = json.loads(runner.invoke(app, [*args, "--json"]).output)
    assert saved == printed
    rows = list(csv.DictReader((out / "steps.csv").open()))
    assert len(rows) == saved["steps"]  # one row per usable step: the log's first line is skipped, its second kept
    assert [r["source"] for r in rows].count("server-log") == 1
    for row in rows:  # the error is the one the page defines, from the row's own two times
        meas, pred = float(row["measured_s"]), float(row["predicted_s"])
        assert float(row["error_pct"]) == pytest.approx(100 * (pred / meas - 1), rel=1e-9)
    page = (out / "validation.html").read_text()
    assert page.count('src="data:image/png;base64,') == 4  # step scatter, drift, run errors, per-request TTFT
    for name in ("step_scatter", "step_drift", "run_errors", "ttft_scatter"):
        assert f'id="fig-{name}"' in page
    assert page.index('id="verdict"') < page.index('id="figures"') < page.index('id="tables"') \
        < page.index('id="configuration"')
    e = saved["step_time_error_pct"]["median_abs"]
    assert f"within {e:.1f} % (median |error|) of the server&#39;s {saved['steps']:,} measured steps" in page
    ttft = saved["runs"][0]["metrics"]["median_ttft_ms"]["error_pct"]
    assert f"bench_serving run: median TTFT error {ttft:+.1f} %." in page
    # a second run into the same folder replaces the three files
    r = runner.invoke(app, [*args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["steps.csv", "validation.html", "validation.json"]


def test_validate_measured_out_refuses_a_foreign_folder(stream, tmp_path):
    out = tmp_path / "val"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    r = runner.invoke(app, ["validate", "--measured", str(stream), *SERVER, "--out", str(out)])
    assert r.exit_code == 2 and r.output.strip().count("\n") == 0
    assert "holds files `validate --measured` does not write (notes.txt)" in r.output
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    cal_dir = tmp_path / "cal"  # calibrate's folder is not validate's either
    assert runner.invoke(app, ["calibrate", "--measured", str(stream), *SERVER, "--out", str(cal_dir)]).exit_code == 0
    before = {p.name: p.read_bytes() for p in cal_dir.iterdir()}
    r = runner.invoke(app, ["validate", "--measured", str(stream), *SERVER, "--out", str(cal_dir)])
    assert r.exit_code == 2 and "calibration.json" in r.output
    assert {p.name: p.read_bytes() for p in cal_dir.iterdir()} == before


def test_validation_page_without_runs_or_steps(stream, tmp_path):
    bench = write_lines(tmp_path / "bench.jsonl", [bench_result()])
    r = runner.invoke(app, ["validate", "--measured", bench, *SERVER, "--out", str(tmp_path / "runs")])
    assert r.exit_code == 0, r.output
    page = (tmp_path / "runs" / "validation.html").read_text()
    assert 'id="no-steps"' in page and 'id="fig-run_errors"' in page and 'id="fig-step_scatter"' not in page
    assert 'id="fig-ttft_scatter"' not in page  # no --output-details
    header = (tmp_path / "runs" / "steps.csv").read_text().splitlines()
    assert len(header) == 1 and header[0].endswith("measured_s,predicted_s,error_pct")
    r = runner.invoke(app, ["validate", "--measured", str(stream), *SERVER, "--out", str(tmp_path / "steps")])
    page = (tmp_path / "steps" / "validation.html").read_text()
    assert r.exit_code == 0 and 'id="no-runs"' in page and page.count('src="data:image/png;base64,') == 2
