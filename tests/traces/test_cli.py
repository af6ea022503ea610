"""`poolsim trace ...`: tables for people, --json for machines, one-line errors with exit code 1."""

import json

from typer.testing import CliRunner

from poolsim import cli
from poolsim.traces import inspect_trace, load_trace
from tests.traces.conftest import MOONCAKE_HEAD
from tests.traces.test_mooncake import SNIPPET

runner = CliRunner()


def run(*args):
    return runner.invoke(cli.app, [str(a) for a in args])


def test_inspect_table(write):
    result = run("trace", "inspect", write(SNIPPET))
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in ("trace (mooncake)", "requests", "2.000 req/s", "71.57 % (3,686 tokens)",
                 "64.29 % (9 of 14 blocks)", "1,030", "1,300"):
        assert text in out, (text, out)


def test_inspect_json_is_the_library_result(write):
    path = write(SNIPPET)
    result = run("trace", "inspect", path, "--json", "--block-size", "256")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == inspect_trace(load_trace(path), block_size=256).to_dict()


def test_bad_line_prints_one_line_and_exits_2(write):
    path = write(SNIPPET.replace('"timestamp": 1500', '"timestamp": 100'))
    result = run("trace", "inspect", path)
    assert result.exit_code == 2
    assert result.stderr == f"error: {path}:3: field 'timestamp': goes backwards (arrival 0.1 s after 0.5 s)\n"
    assert "Traceback" not in result.output


def test_skip_bad_lines_reports_the_count(write):
    path = write(SNIPPET.replace('"timestamp": 1500', '"timestamp": 100'))
    result = run("trace", "inspect", path, "--skip-bad-lines")
    assert result.exit_code == 0 and "4 (1 bad lines skipped)" in result.stdout
    result = run("trace", "inspect", path, "--skip-bad-lines", "--json")
    assert json.loads(result.stdout)["skipped_lines"] == 1


def test_missing_file_and_unknown_format(tmp_path, write):
    result = run("trace", "inspect", tmp_path / "nope.jsonl")
    assert result.exit_code == 2 and result.stderr == f"error: {tmp_path / 'nope.jsonl'}: no such file\n"
    result = run("trace", "inspect", write("hello\n"))
    assert result.exit_code == 2 and "cannot detect the trace format" in result.stderr
    result = run("trace", "inspect", write(SNIPPET), "--format", "csv")
    assert result.exit_code == 2 and "unknown trace format 'csv'" in result.stderr


def test_convert_slice_scale(tmp_path, write):
    out = tmp_path / "o.jsonl"
    result = run("trace", "convert", MOONCAKE_HEAD, out, "--json")
    assert json.loads(result.stdout) == {"path": str(out), "requests": 400, "skipped_lines": 0}
    assert list(load_trace(out)) == list(load_trace(MOONCAKE_HEAD))

    result = run("trace", "slice", write(SNIPPET), out, "--start", "0.5", "--end", "2")
    assert result.stdout == f"wrote 2 requests to {out} (0 bad lines skipped)\n"
    assert [r.arrival_s for r in load_trace(out)] == [0.0, 1.0]

    result = run("trace", "scale", write(SNIPPET), out, "--rate", "4")
    assert result.exit_code == 0
    assert [r.arrival_s for r in load_trace(out)] == [0.0, 0.25, 0.75, 1.0, 1.25]  # 2/s -> 4/s
    result = run("trace", "scale", write(SNIPPET), out)
    assert result.exit_code == 2 and result.stderr == "error: give exactly one of --factor and --rate\n"
    src = write(SNIPPET)
    result = run("trace", "convert", src, src)
    assert result.exit_code == 2 and src.read_text() == SNIPPET  # never truncates its own input


def test_generate(tmp_path):
    out = tmp_path / "g.jsonl"
    result = run("trace", "generate", out, "--preset", "agent", "--sessions", "6", "--seed", "1",
                 "--rate", "step:0=1,10=3", "--cv", "2", "--turns", "fixed:3", "--max-new-tokens", "64", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["requests"] == 18
    rs = list(load_trace(out))
    assert {r.turn for r in rs} == {0, 1, 2} and all(r.output_len <= 64 for r in rs)
    assert {r.segments[0][1] for r in rs} == {6000}
    result = run("trace", "generate", out, "--input-len", "gauss:3")
    assert result.exit_code == 2 and result.stderr.startswith("error: bad length distribution 'gauss:3'")
