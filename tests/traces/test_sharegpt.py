"""ShareGPT conversations: one request per assistant turn, the whole history as the prompt."""

import json

import numpy as np
import pytest

from poolsim.traces import TraceFormatError, load_trace
from poolsim.traces.sharegpt import estimate_tokens, message_segment

A = {"id": "a", "conversations": [
    {"from": "system", "value": "You are helpful."},  # 16 bytes: 4 tokens
    {"from": "human", "value": "Hi"},  # 1
    {"from": "gpt", "value": "Hello!"},  # 6 bytes: 2
    {"from": "human", "value": "Tell me a joke"},  # 14 bytes: 4
    {"from": "gpt", "value": "No."},  # 1
]}
B = {"id": "b", "conversations": [
    {"from": "system", "value": "You are helpful."},
    {"from": "human", "value": "Hi"},
    {"from": "gpt", "value": "Hey"},  # 1
]}


def test_estimated_token_counts():
    assert [estimate_tokens(t) for t in ("", "Hi", "Hello!", "Tell me a joke", "You are helpful.")] == [1, 1, 2, 4, 4]
    assert estimate_tokens("你好") == 2  # 6 UTF-8 bytes
    assert message_segment("user", "Hi") == message_segment("user", "Hi") != message_segment("assistant", "Hi")
    assert 0 <= message_segment("user", "Hi") < 2**42


def test_turns_become_requests_with_the_whole_history(write):
    trace = load_trace(write(json.dumps([A, B], indent=1), "conv.json"))
    assert trace.format == "sharegpt" and len(trace) == 3
    a0, b0, a1 = trace  # arrivals: A starts at 0 s, B at 1 s, A's second turn at 30 s
    assert [(r.rid, r.arrival_s, r.session_id, r.turn) for r in (a0, b0, a1)] == [
        (0, 0.0, "a", 0), (1, 1.0, "b", 0), (2, 30.0, "a", 1)]
    assert [(r.input_len, r.output_len) for r in (a0, b0, a1)] == [(5, 2), (5, 1), (11, 1)]
    sys_seg, hi = message_segment("system", "You are helpful."), message_segment("user", "Hi")
    hello = message_segment("assistant", "Hello!")
    assert a0.segments == ((sys_seg, 4), (hi, 1)) == b0.segments
    assert a0.output_segment == hello
    assert a1.segments == ((sys_seg, 4), (hi, 1), (hello, 2), (message_segment("user", "Tell me a joke"), 4))
    # what the simulator decodes for turn 0 is exactly what turn 1's prompt holds
    assert np.array_equal(a1.prompt_tokens()[:7], np.concatenate([a0.prompt_tokens(), a0.output_tokens(2)]))


def test_openai_messages_and_jsonl_give_the_same_requests(write):
    def openai(conv):
        role = {"system": "system", "human": "user", "gpt": "assistant"}
        return {"id": conv["id"], "messages": [{"role": role[m["from"]], "content": m["value"]}
                                               for m in conv["conversations"]]}

    expect = list(load_trace(write(json.dumps([A, B]), "a.json")))
    assert list(load_trace(write(json.dumps([openai(A), openai(B)]), "b.json"))) == expect
    jsonl = write(json.dumps(A) + "\n" + json.dumps(openai(B)) + "\n", "c.jsonl")
    assert list(load_trace(jsonl)) == expect


def test_leading_assistant_message_and_missing_id(write):
    conv = {"conversations": [{"from": "gpt", "value": "Welcome"}, {"from": "human", "value": "Hi"},
                              {"from": "gpt", "value": "Yo"}]}
    (r,) = load_trace(write(json.dumps([conv]), "c.json"))
    assert r.session_id == "conv0" and r.turn == 0 and r.input_len == 2 + 1  # "Welcome" is history, not a request


ARRAY = """[
 {"id": "a", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]},
 {"id": "b", "conversations": [{"from": "robot", "value": "Hi"}]},
 {"id": "c", "conversations": [{"from": "human", "value": 5}]},
 {"id": "d", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]}
]"""


def test_bad_conversation_names_its_line_and_field(write):
    path = write(ARRAY, "c.json")
    with pytest.raises(TraceFormatError) as e:
        load_trace(path)
    assert str(e.value) == f"{path}:3: field 'conversations[0].from': unknown role 'robot'"
    trace = load_trace(path, skip_bad_lines=True)
    assert (len(trace), trace.skipped_lines) == (2, 2)
    assert [r.arrival_s for r in trace] == [0.0, 1.0]  # "d" is the second conversation that yields requests


def test_syntax_error_in_an_array_is_never_skipped(write):
    path = write('[\n {"id": "a",\n  "conversations": [}\n]', "c.json")
    with pytest.raises(TraceFormatError, match=r"c.json:3: invalid JSON"):
        load_trace(path, skip_bad_lines=True)
    with pytest.raises(TraceFormatError, match=r"c.json:2: invalid JSON: extra data after the array"):
        load_trace(write("[]\n[]", "c.json"), format="sharegpt")


def test_lone_surrogates_do_not_crash(write):
    conv = '[{"conversations": [{"from": "human", "value": "\\ud800x"}, {"from": "gpt", "value": "\\udfff"}]}]'
    (r,) = load_trace(write(conv, "c.json"))
    assert (r.input_len, r.output_len) == (1, 1)  # 4 and 3 bytes with surrogatepass
