"""Prefix sharing with an unbounded cache: hand-computed cases, and the fast trie against naive methods."""

import json

import numpy as np
import pytest

from poolsim.traces import (
    Request,
    Trace,
    chat_spec,
    generate,
    inspect_trace,
    load_trace,
    mean_rate,
    shared_prefix_lengths,
)
from poolsim.traces.inspect import shared_blocks
from tests.traces.conftest import AZURE_HEAD, MOONCAKE_HEAD, shared_file
from tests.traces.test_mooncake import SNIPPET
from tests.traces.test_sharegpt import A, B
from tests.traces.test_tokens_poolsim import TOKENS


def naive_shared(trace):
    """L_r by brute force: compare the prompt token by token with every earlier prompt + output."""
    seen, out = [], []
    for r in trace:
        p = r.prompt_tokens()
        best = 0
        for ns, q in seen:
            if ns != r.namespace:
                continue
            m = min(len(p), len(q))
            diff = np.flatnonzero(p[:m] != q[:m])
            best = max(best, int(diff[0]) if len(diff) else m)
        out.append(best)
        seen.append((r.namespace, np.concatenate([p, r.output_tokens(r.output_len)])))
    return np.array(out)


def test_mooncake_snippet_by_hand(write):
    stats = inspect_trace(load_trace(write(SNIPPET)))
    # L = 0; 1024 (blocks 0,1); 512 (block 0); 1100 (identical prompt); 1050 (a shorter partial block 2)
    assert shared_prefix_lengths(load_trace(write(SNIPPET))).tolist() == [0, 1024, 512, 1100, 1050]
    assert (stats.shared_tokens, stats.prompt_tokens) == (3686, 5150)
    assert stats.token_sharing == 3686 / 5150
    # blocks: 3 + 3 + 2 + 3 + 3 = 14; shared 0 + 2 + 1 + 3 + 3 = 9 (whole prompts count their partial block)
    assert (stats.shared_blocks, stats.blocks, stats.block_sharing) == (9, 14, 9 / 14)
    assert (stats.requests, stats.duration_s, stats.rate_per_s) == (5, 2.5, 2.0)
    assert stats.input_len == {"mean": 1030.0, "p50": 1100.0, "p90": 1220.0, "p99": 1292.0, "max": 1300.0}


def test_sharegpt_by_hand(write):
    trace = load_trace(write(json.dumps([A, B]), "c.json"))
    # A0 shares nothing; B0's prompt (system, Hi) is A0's: 5; A1 holds A0's prompt + answer: 4 + 1 + 2 = 7
    assert shared_prefix_lengths(trace).tolist() == [0, 5, 7]
    stats = inspect_trace(trace, block_size=4)
    assert stats.token_sharing == 12 / 21
    # blocks of 4: A0 2 (0 shared), B0 2 (both: the whole prompt), A1 3 (7 // 4 = 1)
    assert (stats.shared_blocks, stats.blocks) == (3, 7)
    assert stats.sessions == 2


def test_tokens_and_namespaces_by_hand(write):
    trace = load_trace(write(TOKENS))
    # r1 is in namespace "x": nothing to share; r2 shares [1, 2, 3] with r0 (r0's output is private)
    assert shared_prefix_lengths(trace).tolist() == [0, 0, 3]
    no_ns = Trace.from_requests([Request(rid=0, arrival_s=0.0, input_len=4, output_len=1, token_ids=[1, 2, 3, 4]),
                                 Request(rid=1, arrival_s=1.0, input_len=3, output_len=1, token_ids=[1, 2, 9])],
                                name="t")
    assert shared_prefix_lengths(no_ns).tolist() == [0, 2]


def test_segment_namespaces_never_share():
    reqs = [Request(rid=i, arrival_s=float(i), input_len=8, output_len=1, segments=((1, 8),), namespace=ns)
            for i, ns in enumerate(["a", "b", "a", None, None])]
    assert shared_prefix_lengths(Trace.from_requests(reqs, name="ns")).tolist() == [0, 0, 8, 0, 8]


def test_block_count_rule():
    shared, lens = np.array([0, 512, 1000, 1000, 1024]), np.array([100, 1000, 1000, 1100, 1024])
    # 100: 1 block, 0; 1000: 2 blocks, 512 -> 1; whole 1000 -> 2; 1000 of 1100: 1 of 3; whole 1024: 2 of 2
    assert shared_blocks(shared, lens, 512) == (6, 10)


def test_fast_equals_naive_on_the_real_mooncake_slice():
    trace = load_trace(MOONCAKE_HEAD).materialize()
    fast = shared_prefix_lengths(trace)
    assert np.array_equal(fast, naive_shared(trace))
    assert (fast > 512).sum() > 30  # the slice does exercise multi-block sharing


def test_fast_equals_naive_on_generated_chats_and_tokens():
    trace = generate(chat_spec(num_sessions=40, system_prompt_fanout=10), seed=4).materialize()
    assert np.array_equal(shared_prefix_lengths(trace), naive_shared(trace))
    as_tokens = Trace.from_requests([Request(rid=r.rid, arrival_s=r.arrival_s, input_len=r.input_len,
                                             output_len=r.output_len, token_ids=r.prompt_tokens() % 1000)
                                     for r in trace], name="tok")
    assert np.array_equal(shared_prefix_lengths(as_tokens), naive_shared(as_tokens))


def test_percentiles_and_rate_match_numpy():
    trace = load_trace(AZURE_HEAD)
    stats = inspect_trace(trace)
    inputs = np.array([r.input_len for r in trace])
    assert stats.input_len["p90"] == np.percentile(inputs, 90) and stats.input_len["max"] == inputs.max()
    assert stats.rate_per_s == 500 / stats.duration_s == mean_rate(trace)
    assert (stats.token_sharing, stats.block_sharing) == (0.0, 0.0)  # Azure carries no prefix identity


def test_mooncake_full_trace_against_the_raw_hash_chains():
    path = shared_file("mooncake_conversation_trace.jsonl")
    stats = inspect_trace(load_trace(path))
    # Independent count: a block is shared when its whole hash chain (hash_ids[:j+1]) was seen before.
    chains, hits, blocks = {}, 0, 0
    for line in path.open():
        node = -1
        for h in json.loads(line)["hash_ids"]:
            blocks += 1
            hits += (node, h) in chains
            node = chains.setdefault((node, h), len(chains))
    assert (stats.shared_blocks, stats.blocks) == (hits, blocks) == (105_710, 288_500)
    # the README's figures (token granularity cross-checked against the naive method on the slice above)
    assert (stats.requests, stats.duration_s) == (12031, 3536.999)
    assert (stats.shared_tokens, stats.prompt_tokens) == (54_098_411, 144_793_823)
    assert f"{stats.token_sharing:.4f} {stats.block_sharing:.4f} {stats.rate_per_s:.3f}" == "0.3736 0.3664 3.401"


def test_empty_and_single_request_traces():
    empty = inspect_trace(Trace.from_requests([], name="e"))
    assert (empty.requests, empty.rate_per_s, empty.token_sharing, empty.input_len) == (0, None, None, {})
    one = inspect_trace(Trace.from_requests([Request(rid=0, arrival_s=3.0, input_len=5, output_len=1)], name="o"))
    assert (one.requests, one.duration_s, one.rate_per_s, one.token_sharing) == (1, 0.0, None, 0.0)
    with pytest.raises(ValueError):
        inspect_trace(Trace.from_requests([], name="e"), block_size=0)
