"""Files a new user hands poolsim by mistake: each is one line saying what is wrong, or (a BOM) simply works."""

import pytest
from typer.testing import CliRunner

from poolsim.cli import app
from poolsim.traces import TraceFormatError, load_trace
from poolsim.traces.lines import HEAD_BYTES

runner = CliRunner()
MOONCAKE = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'


def test_sharegpt_without_requests_says_why(write):
    why = "no requests: no conversation has an assistant turn after a user or system message"
    for text in ("[]", '[{"conversations": [{"from": "human", "value": "hi"}]}]',
                 '{"messages": [{"role": "assistant", "content": "first"}]}\n'):
        with pytest.raises(TraceFormatError, match=why):
            load_trace(write(text, "c.json"))
    res = runner.invoke(app, ["run", str(write("[]", "c.json")), "--model", "llama-3.1-8b", "--gpu", "H100"])
    assert res.exit_code == 2 and res.output == f"error: {write('[]', 'c.json')}: {why}\n"


def test_every_line_skipped_is_no_requests(write):
    path = write('{"timestamp": 0, "input_length": -1}\n')
    with pytest.raises(TraceFormatError, match=r"no requests: it holds no request lines \(1 bad lines skipped\)"):
        load_trace(path, skip_bad_lines=True)


@pytest.mark.parametrize("text, where", [
    ('{"timestamp": 1e300, "input_length": 10, "output_length": 5, "hash_ids": [1]}',
     "trace.jsonl:1: field 'timestamp'"),
    ('{"arrival_s": 31536001, "input_len": 10, "output_len": 5}', "trace.jsonl:1: field 'arrival_s'"),
])
def test_arrivals_more_than_a_year_in_are_rejected(write, text, where):
    with pytest.raises(TraceFormatError, match=f"{where}: arrives .* more than a year"):
        load_trace(write(text + "\n"))
    assert load_trace(write('{"arrival_s": 31536000, "input_len": 10, "output_len": 5}\n')).format == "poolsim"


def test_azure_a_year_after_the_first_row(write):
    csv = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,10,5\n"
           "2024-11-16 18:15:46.5,10,5\n")  # 366 days (2024 is a leap year) + 0.5 s later
    with pytest.raises(TraceFormatError, match=r"trace.csv:3: field 'TIMESTAMP': arrives 3.162e\+07 s"):
        load_trace(write(csv, "trace.csv"))


def test_a_utf8_bom_is_accepted_in_every_format(write):
    bom = b"\xef\xbb\xbf"
    assert len(load_trace(write(bom + MOONCAKE.encode()))) == 1
    csv = b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,10,5\n"
    assert load_trace(write(bom + csv, "a.csv")).format == "azure"
    conv = b'[{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}]'
    assert len(load_trace(write(bom + conv, "c.json"))) == 1
    assert len(load_trace(write(bom + conv[1:-1] + b"\n", "c.jsonl"))) == 1


def test_a_directory_says_so(tmp_path):
    with pytest.raises(TraceFormatError, match=f"^{tmp_path}: is a directory, not a trace file$"):
        load_trace(tmp_path)
    res = runner.invoke(app, ["trace", "inspect", str(tmp_path)])
    assert res.exit_code == 2 and res.output == f"error: {tmp_path}: is a directory, not a trace file\n"


def test_azure_missing_column_is_explained_without_format(write):
    path = write("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.0,10\n", "a.csv")
    with pytest.raises(TraceFormatError, match="a.csv:1: field 'GeneratedTokens': missing column in the CSV header"):
        load_trace(path)


@pytest.mark.parametrize("content", [b"\0" * (3 * HEAD_BYTES), MOONCAKE.encode() + b"\0\0\0\n",
                                     MOONCAKE.encode().replace(b"\n", b"\0"), b"\xff\xfe{\0\"\0"])
def test_binary_content_stops_at_the_first_block(write, content):
    with pytest.raises(TraceFormatError, match="binary content .NUL bytes in the first 64 KiB.; a trace is UTF-8 text"):
        load_trace(write(content), format="mooncake")
    with pytest.raises(TraceFormatError, match="binary content"):
        load_trace(write(content))
