"""Azure LLM inference CSV: datetime arrivals relative to the first row, errors, and the real trace."""

import csv
from datetime import datetime

import pytest

from poolsim.traces import TraceFormatError, load_trace
from tests.traces.conftest import AZURE_HEAD, shared_file

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
SNIPPET = HEADER + """2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:16:01.0000000,10,1
"""


def test_snippet(write):
    trace = load_trace(write(SNIPPET, "t.csv"))
    assert trace.format == "azure" and len(trace) == 3
    rs = list(trace)
    # 50.9951690 - 46.6805900 = 4.3145790; 61.0 - 46.68059 = 14.31941
    assert [r.arrival_s for r in rs] == pytest.approx([0.0, 4.314579, 14.31941], abs=1e-9)
    assert [(r.input_len, r.output_len) for r in rs] == [(374, 44), (396, 109), (10, 1)]
    assert all(r.segments is None and r.token_ids is None for r in rs)  # no prefix identity: private prompts
    assert rs[1].prompt_tokens()[0] == (2**42 + 2) * 2**20


def test_sub_microsecond_digits_survive(write):
    rs = list(load_trace(write(HEADER + "2023-11-16 18:15:46.0000001,1,1\n2023-11-16 18:15:46.0000009,1,1\n", "t.csv")))
    assert rs[1].arrival_s == pytest.approx(8e-7, abs=1e-12)


def test_midnight_time_zones_and_extra_columns(write):
    text = ("ContextTokens,TIMESTAMP,Extra,GeneratedTokens\n"
            "5,2023-11-16T23:59:59.5Z,x,2\n"
            "6,2023-11-17 00:00:00.25,y,3\n"
            "7,2023-11-17T01:00:01+01:00,z,4\n")  # 00:00:01 UTC
    rs = list(load_trace(write(text, "t.csv")))
    assert [r.arrival_s for r in rs] == pytest.approx([0.0, 0.75, 1.5])
    assert [(r.input_len, r.output_len) for r in rs] == [(5, 2), (6, 3), (7, 4)]


@pytest.mark.parametrize("row, message", [
    ("2023-11-16 18:15:47.0,abc,1", "field 'ContextTokens': must be a whole number of tokens, got 'abc'"),
    ("2023-11-16 18:15:47.0,-3,1", "field 'ContextTokens': must be a whole number of tokens, got '-3'"),
    ("2023-11-16 18:15:47.0,3,0", "field 'GeneratedTokens': must be an integer in [1, 2**20], got 0"),
    ("2023-11-16 18:15:47.0,3", "field 'GeneratedTokens': missing"),
    ("16/11/2023 18:15,3,1", "field 'TIMESTAMP': '16/11/2023 18:15' is not a datetime"),
    ("2023-11-16 25:15:47.0,3,1", "field 'TIMESTAMP': '2023-11-16 25:15:47.0' has an impossible time of day"),
    ("2023-11-16 18:15:45.0,3,1", "field 'TIMESTAMP': goes backwards (2023-11-16 18:15:45.0 is before the first row)"),
])
def test_bad_rows(write, row, message):
    path = write(HEADER + "2023-11-16 18:15:46.5,1,1\n" + row + "\n", "t.csv")
    with pytest.raises(TraceFormatError) as e:
        load_trace(path)
    assert str(e.value).startswith(f"{path}:3: {message}")


def test_backwards_after_the_first_row(write):
    path = write(HEADER + "2023-11-16 18:15:46,1,1\n2023-11-16 18:15:50,1,1\n2023-11-16 18:15:48,1,1\n", "t.csv")
    with pytest.raises(TraceFormatError) as e:
        load_trace(path)
    assert str(e.value) == f"{path}:4: field 'TIMESTAMP': goes backwards (arrival 2 s after 4 s)"
    trace = load_trace(path, skip_bad_lines=True)
    assert (len(trace), trace.skipped_lines) == (2, 1)


def test_header_without_a_column(write):
    path = write("TIMESTAMP,ContextTokens,Generated\n2023-11-16 18:15:46,1,1\n", "t.csv")
    with pytest.raises(TraceFormatError) as e:
        load_trace(path, format="azure", skip_bad_lines=True)  # nothing after a bad header can be read
    assert str(e.value) == f"{path}:1: field 'GeneratedTokens': missing column in the CSV header"


def _raw_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_real_slice_matches_the_csv():
    rows = _raw_rows(AZURE_HEAD)
    rs = list(load_trace(AZURE_HEAD))
    assert len(rs) == len(rows) == 500
    assert [r.input_len for r in rs] == [int(d["ContextTokens"]) for d in rows]
    assert [r.output_len for r in rs] == [int(d["GeneratedTokens"]) for d in rows]
    t0 = datetime.fromisoformat(rows[0]["TIMESTAMP"][:26])  # 6 fraction digits: the 7th is 0 in this file
    expect = [(datetime.fromisoformat(d["TIMESTAMP"][:26]) - t0).total_seconds() for d in rows]
    assert [r.arrival_s for r in rs] == pytest.approx(expect, abs=1e-6)


def test_real_full_trace():
    trace = load_trace(shared_file("azure2023_conv.csv"))
    assert trace.format == "azure" and len(trace) == 19366
    last = list(trace)[-1]
    # 2023-11-16 19:14:08.4025270 - 2023-11-16 18:15:46.6805900 = 58 min 21.7219370 s
    assert last.arrival_s == pytest.approx(3501.721937, abs=1e-6)
    assert (last.input_len, last.output_len) == (197, 183)
