"""Explicit token ids, and poolsim's own format: round trips from every other format."""

import json

import numpy as np
import pytest

from poolsim.traces import TraceFormatError, chat_spec, generate, load_trace, write_trace
from tests.traces.conftest import AZURE_HEAD, MOONCAKE_HEAD

TOKENS = """{"arrival_s": 0, "token_ids": [1, 2, 3, 4], "output_len": 2, "max_new_tokens": 8}
{"arrival_s": 1.5, "token_ids": [1, 2, 9], "output_len": 1, "namespace": "x", "session_id": "s", "turn": 3}
{"arrival_s": 2, "token_ids": [1, 2, 3, 5, 6], "output_len": 3, "ignore_eos": true, "max_new_tokens": 3}
"""


def test_tokens_format(write):
    trace = load_trace(write(TOKENS))
    assert trace.format == "tokens" and len(trace) == 3
    r0, r1, r2 = trace
    assert r0.prompt_tokens().tolist() == [1, 2, 3, 4] and r0.input_len == 4 and r0.max_new_tokens == 8
    assert (r1.arrival_s, r1.namespace, r1.session_id, r1.turn) == (1.5, "x", "s", 3)
    assert r2.ignore_eos and r2.output_len == 3
    assert r0.output_tokens(1)[0] == (2**42 + 1) * 2**20  # private: above every vocabulary id


@pytest.mark.parametrize("line, message", [
    ('{"arrival_s": 0, "token_ids": [], "output_len": 1}', "field 'token_ids': is empty"),
    ('{"arrival_s": 0, "token_ids": [1, -2], "output_len": 1}', "field 'token_ids': ids must lie in [0, 2**62)"),
    ('{"arrival_s": 0, "token_ids": [1, 1180591620717411303424], "output_len": 1}',  # 2**70
     "field 'token_ids': must be integers"),
    ('{"arrival_s": 0, "token_ids": [1, true], "output_len": 1}', "field 'token_ids': must be an integer, got True"),
    ('{"arrival_s": -1, "token_ids": [1], "output_len": 1}', "field 'arrival_s': must be a finite number >= 0"),
    ('{"arrival_s": 0, "token_ids": [1], "output_len": 5, "max_new_tokens": 4}',
     "field 'output_len': 5 exceeds max_new_tokens 4"),
    ('{"arrival_s": 0, "token_ids": [1], "output_len": 1, "ignore_eos": "yes"}',
     "field 'ignore_eos': must be true or false"),
])
def test_tokens_errors(write, line, message):
    path = write(line + "\n")
    with pytest.raises(TraceFormatError) as e:
        load_trace(path, format="tokens")
    assert str(e.value).startswith(f"{path}:1: {message}")


def _roundtrip(trace, tmp_path):
    out = tmp_path / "out.jsonl"
    assert write_trace(trace, out) == len(trace)
    back = load_trace(out)
    assert back.format == "poolsim"
    return back


def test_roundtrip_of_every_format(tmp_path, write):
    sharegpt = write(json.dumps([{"id": "a", "conversations": [
        {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"},
        {"from": "human", "value": "More"}, {"from": "gpt", "value": "Fine"}]}]), "c.json")
    for path in (MOONCAKE_HEAD, AZURE_HEAD, write(TOKENS), sharegpt):
        trace = load_trace(path)
        assert list(_roundtrip(trace, tmp_path)) == list(trace), path
    gen = generate(chat_spec(num_sessions=20, max_new_tokens=300), seed=3)
    back = list(_roundtrip(gen, tmp_path))
    assert back == list(gen) and back[0].max_new_tokens == 300 and back[0].output_segment is not None


def test_poolsim_line_written_out():
    (r,) = list(load_trace(MOONCAKE_HEAD))[:1]
    from poolsim.traces.poolsim_format import to_json

    assert json.loads(to_json(r)) == {
        "rid": 0, "arrival_s": 0.0, "input_len": 6758, "output_len": 500, "max_new_tokens": None,
        "ignore_eos": False, "session_id": None, "turn": None, "namespace": None,
        "segments": [[i, 512] for i in range(13)] + [[13, 102]], "token_ids": None, "output_segment": None}


def test_poolsim_minimal_line_and_renumbering(write):
    path = write('{"rid": 7, "arrival_s": 0.25, "input_len": 3, "output_len": 2}\n'
                 '{"rid": 9, "arrival_s": 0.5, "input_len": 2, "output_len": 1, "segments": [[4, 2]], '
                 '"output_segment": 5}\n')
    r0, r1 = load_trace(path)
    assert (r0.rid, r0.segments, r0.token_ids, r0.ignore_eos) == (0, None, None, False)
    assert r1.rid == 1 and r1.segments == ((4, 2),) and r1.output_tokens(1)[0] == 5 * 2**20


@pytest.mark.parametrize("line2, message", [
    ('{"arrival_s": 1, "input_len": 2, "output_len": 1, "token_ids": [1, 2]}',
     "field 'token_ids': the trace already uses segments; it cannot mix the two forms"),
    ('{"arrival_s": 1, "input_len": 6, "output_len": 1, "segments": [[1, 5]]}',
     "field 'segments': lengths sum to 5, not input_len=6"),
    ('{"arrival_s": 1, "input_len": 5, "output_len": 1, "segments": [1, 5]}',
     "field 'segments': must be a list of [segment_id, length] pairs"),
    ('{"arrival_s": 1, "input_len": 5, "output_len": 1, "segments": [[1, 5]], "output_segment": -1}',
     "field 'output_segment': must be >= 0, got -1"),
    ('{"arrival_s": 0.5, "input_len": 2, "output_len": 1}', "field 'arrival_s': goes backwards"),
])
def test_poolsim_errors(write, line2, message):
    path = write('{"arrival_s": 1, "input_len": 2, "output_len": 1, "segments": [[3, 2]]}\n' + line2 + "\n")
    with pytest.raises(TraceFormatError) as e:
        load_trace(path)
    assert str(e.value).startswith(f"{path}:2: {message}")


def test_token_ids_survive_the_roundtrip_exactly(tmp_path, write):
    back = list(_roundtrip(load_trace(write(TOKENS)), tmp_path))
    assert back[2].prompt_tokens().tolist() == [1, 2, 3, 5, 6]
    assert isinstance(back[2].token_ids, np.ndarray)
