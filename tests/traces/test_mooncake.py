"""Mooncake JSONL: a hand-made snippet, errors naming file/line/field, the real trace, and streaming."""

import json
import tracemalloc

import numpy as np
import pytest

from poolsim.traces import TraceFormatError, load_trace
from poolsim.traces import load as trace_load
from tests.traces.conftest import MOONCAKE_HEAD, shared_file

# ts (ms), input, output, hash_ids; 512-token blocks, the last partial
SNIPPET = "\n".join(json.dumps(d) for d in [
    {"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 2]},
    {"timestamp": 500, "input_length": 1300, "output_length": 20, "hash_ids": [0, 1, 3]},
    {"timestamp": 1500, "input_length": 600, "output_length": 5, "hash_ids": [0, 4]},
    {"timestamp": 2000, "input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 2]},
    {"timestamp": 2500, "input_length": 1050, "output_length": 3, "hash_ids": [0, 1, 2]},
]) + "\n"


def test_snippet_fields_and_segments(write):
    trace = load_trace(write(SNIPPET))
    assert trace.format == "mooncake" and len(trace) == 5 and trace.skipped_lines == 0
    rs = list(trace)
    assert [r.rid for r in rs] == [0, 1, 2, 3, 4]
    assert [r.arrival_s for r in rs] == [0.0, 0.5, 1.5, 2.0, 2.5]
    assert [(r.input_len, r.output_len) for r in rs] == [(1100, 10), (1300, 20), (600, 5), (1100, 7), (1050, 3)]
    assert rs[0].segments == ((0, 512), (1, 512), (2, 76))  # 1100 - 2 * 512 = 76
    assert rs[2].segments == ((0, 512), (4, 88))
    assert rs[0].max_new_tokens is None and rs[0].session_id is None and rs[0].output_segment is None


def test_snippet_token_ids_of_the_partial_block(write):
    rs = list(load_trace(write(SNIPPET)))
    p0 = rs[0].prompt_tokens()
    assert len(p0) == 1100
    assert p0[0] == 0 and p0[511] == 511 and p0[512] == 1048576  # segment 1 starts at 1 * 2**20
    assert p0[1024] == 2097152 and p0[1099] == 2097227  # segment 2, tokens 0 and 75
    assert np.array_equal(rs[4].prompt_tokens(), p0[:1050])  # same hash, shorter partial block: a prefix
    assert np.array_equal(rs[3].prompt_tokens(), p0)


def test_large_hash_ids_are_folded(write):
    path = write(json.dumps({"timestamp": 0, "input_length": 600, "output_length": 1,
                             "hash_ids": [2**63 + 5, -3]}) + "\n")
    (r,) = load_trace(path)
    assert all(0 <= s < 2**42 for s, _ in r.segments)
    assert r.segments[1][1] == 88


@pytest.mark.parametrize("line2, message", [
    ('{"timestamp": 1, "input_length": 10, "hash_ids": [1]}', "field 'output_length': missing"),
    ('{"timestamp": 1, "input_length": -5, "output_length": 1, "hash_ids": [1]}',
     "field 'input_length': must be >= 1, got -5"),
    ('{"timestamp": 1, "input_length": 10, "output_length": -1, "hash_ids": [1]}',
     "field 'output_length': must be >= 1, got -1"),
    ('{"timestamp": 1, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}',
     "field 'hash_ids': has 2 ids, but input_length 1025 needs ceil(1025/512) = 3"),
    ('{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1.5]}',
     "field 'hash_ids': must be an integer, got 1.5"),
    ('{"timestamp": "soon", "input_length": 10, "output_length": 1, "hash_ids": [1]}',
     "field 'timestamp': must be a number, got 'soon'"),
    ('{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": 7}',
     "field 'hash_ids': must be a list of integers, got a number"),
    ('{"timestamp": 100, "input_length": 10, "output_length": 1, ', "invalid JSON: "),
    ('[1, 2]', "expected a JSON object, got an array"),
    ('null', "expected a JSON object, got null"),
])
def test_bad_line_names_file_line_and_field(write, line2, message):
    path = write('{"timestamp": 200, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n' + line2 + "\n")
    with pytest.raises(TraceFormatError) as e:
        load_trace(path)
    assert str(e.value).startswith(f"{path}:2: {message}")
    assert "\n" not in str(e.value)


def test_timestamps_going_backwards(write):
    path = write('{"timestamp": 200, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
                 '{"timestamp": 100, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
    with pytest.raises(TraceFormatError) as e:
        load_trace(path)
    assert str(e.value) == f"{path}:2: field 'timestamp': goes backwards (arrival 0.1 s after 0.2 s)"
    assert (e.value.line, e.value.field) == (2, "timestamp")


def test_bad_byte_names_its_line(write):
    path = write(b'{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n\n{"timestamp"\xff}\n')
    with pytest.raises(TraceFormatError, match=r":3: not UTF-8 text"):
        load_trace(path, format="mooncake")


def test_skip_bad_lines_counts_them(write):
    lines = SNIPPET.splitlines()
    lines.insert(1, '{"timestamp": 100, "input_length": 10}')  # missing fields
    lines.insert(3, '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [9]}')  # backwards
    trace = load_trace(write("\n".join(lines) + "\n"), skip_bad_lines=True)
    assert trace.skipped_lines == 2 and len(trace) == 5
    assert [r.rid for r in trace] == [0, 1, 2, 3, 4]
    assert [r.input_len for r in trace] == [1100, 1300, 600, 1100, 1050]


def test_real_slice_matches_the_raw_json():
    raw = [json.loads(line) for line in MOONCAKE_HEAD.read_text().splitlines()]
    trace = load_trace(MOONCAKE_HEAD)
    rs = list(trace)
    assert len(trace) == len(rs) == 400
    assert [r.arrival_s * 1000 for r in rs] == [d["timestamp"] for d in raw]
    assert [r.input_len for r in rs] == [d["input_length"] for d in raw]
    assert [[s for s, _ in r.segments] for r in rs] == [d["hash_ids"] for d in raw]
    assert rs[0].input_len == 6758 and rs[0].segments[-1] == (13, 102)  # 6758 - 13 * 512


def test_real_full_trace():
    path = shared_file("mooncake_conversation_trace.jsonl")
    trace = load_trace(path)
    assert trace.format == "mooncake" and len(trace) == 12031 and trace.skipped_lines == 0
    total = sum(json.loads(line)["input_length"] for line in path.open())
    last = None
    n = 0
    for r in trace:
        n += r.input_len
        last = r
    assert n == total == 144_793_823
    assert last.arrival_s == 3536.999 and last.rid == 12030


def _blocks_file(write):
    # 2,000 requests of 40 blocks each: as Request objects they take about 8 MB
    line = '{{"timestamp": {t}, "input_length": 20000, "output_length": 100, "hash_ids": [{ids}]}}\n'
    return write("".join(line.format(t=i, ids=", ".join(str(i * 40 + j) for j in range(40))) for i in range(2000)))


def test_a_file_over_the_keep_budget_streams(write, monkeypatch):
    monkeypatch.setattr(trace_load, "KEEP_BYTES", 1_000_000)  # the 2,000 requests need ~8 MB
    path = _blocks_file(write)
    tracemalloc.start()
    try:
        trace = load_trace(path)
        count = sum(r.input_len for r in trace)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 2000 * 20000 and len(trace) == 2000
    assert peak < 2_000_000, peak  # the budget's worth while counting, then one request at a time
    path.write_text(path.read_text().replace('"output_length": 100', '"output_length": 7'))
    assert next(iter(trace)).output_len == 7  # each pass reads the file again


def test_a_file_within_the_keep_budget_is_parsed_once(write):
    path = _blocks_file(write)
    trace = load_trace(path)
    first = list(trace)
    path.unlink()  # iterating again needs no file: the requests were kept by the one parse
    again = list(trace)
    assert len(again) == len(trace) == 2000 and again == first
    assert [r.rid for r in again] == list(range(2000))
    assert again[1999].segments[0] == (1999 * 40, 512) and again[1999].segments[-1] == (1999 * 40 + 39, 20000 - 39 * 512)
