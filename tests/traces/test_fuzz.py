"""Random bytes and random JSON into every loader: a valid trace or TraceFormatError, never another exception."""

import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from poolsim.traces import FORMATS, TraceFormatError, inspect_trace, load_trace

# FUZZ_EXAMPLES=1500 runs a deeper search (done once for these loaders: no failure)
FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", 25)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
ALL_FORMATS = [None, *FORMATS]

scalars = (st.none() | st.booleans() | st.integers() | st.integers(-3, 1100)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
small_ints = st.lists(st.integers(-2, 2**64 + 3) | st.integers(0, 5), max_size=4)
KEYS = ["timestamp", "input_length", "output_length", "hash_ids", "arrival_s", "input_len", "output_len",
        "token_ids", "segments", "max_new_tokens", "ignore_eos", "session_id", "turn", "namespace",
        "output_segment", "rid"]
likely = {k: json_values | st.integers(-1, 1100) | small_ints for k in KEYS}
likely["segments"] = json_values | st.lists(st.lists(st.integers(-1, 600), min_size=2, max_size=2), max_size=3)
records = st.fixed_dictionaries({}, optional=likely) | st.dictionaries(st.text(max_size=6), json_values, max_size=4)
roles = st.sampled_from(["human", "gpt", "system", "user", "assistant", "robot"]) | json_values
messages = st.lists(st.fixed_dictionaries({}, optional={"from": roles, "value": st.text(max_size=20) | json_values,
                                                         "role": roles, "content": st.text(max_size=20)}), max_size=5)
conversations = st.fixed_dictionaries({}, optional={"id": json_values, "conversations": messages | json_values,
                                                    "messages": messages}) | json_values


def check(content: bytes, fmt, name="fuzz"):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / name
        path.write_bytes(content)
        for skip in (False, True):
            try:
                trace = load_trace(path, format=fmt, skip_bad_lines=skip)
            except TraceFormatError as e:
                assert "\n" not in str(e)
                continue
            for r in trace:
                assert len(r.prompt_tokens()) == r.input_len
                r.output_tokens(min(r.output_len, 4))
            inspect_trace(trace)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
@FUZZ
@given(content=st.binary(max_size=400))
def test_random_bytes(fmt, content):
    check(content, fmt)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
@FUZZ
@given(lines=st.lists(records, min_size=1, max_size=5))
def test_random_json_lines(fmt, lines):
    check("\n".join(json.dumps(x) for x in lines).encode(), fmt)


@pytest.mark.parametrize("fmt", [None, "sharegpt"])
@FUZZ
@given(convs=st.lists(conversations, max_size=4), as_array=st.booleans())
def test_random_conversations(fmt, convs, as_array):
    text = json.dumps(convs) if as_array else "\n".join(json.dumps(c) for c in convs)
    check(text.encode("utf-8", "surrogatepass"), fmt)


cells = st.text(max_size=30) | st.sampled_from(["2023-11-16 18:15:46.6805900", "2023-11-16T18:15:47Z", "12", "0"])


@pytest.mark.parametrize("fmt", [None, "azure"])
@FUZZ
@given(rows=st.lists(st.lists(cells, min_size=0, max_size=4), max_size=5))
def test_random_csv_rows(fmt, rows):
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(",".join(r) for r in rows)
    check(text.encode("utf-8", "surrogatepass"), fmt, "fuzz.csv")
