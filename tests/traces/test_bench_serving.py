"""bench_serving's datasets and arrivals, checked against numbers derived from SGLang 0.5.23's formulas.

numpy's legacy generator (what ``np.random.seed`` drives) draws ``randint(low, high + 1)`` by masked rejection
on 32-bit Mersenne Twister words: ``v = word & mask`` (mask = the next power of two minus 1 above high - low),
kept when ``v <= high - low``, giving ``low + v``; ``exponential(s)`` is ``-s * log(1 - u)`` with
``u = ((a >> 5) * 2**26 + (b >> 6)) / 2**53`` from two words. The tests derive expected values from the raw words
with these rules, independently of ``randint`` / ``exponential``.
"""

import json
import math
import random

import numpy as np
import pytest

from poolsim.traces.bench_serving import bench_requests, random_lens, warmup_requests
from poolsim.traces.errors import TraceFormatError
from poolsim.traces.sharegpt import message_segment


def words(seed, n):
    return [int(w) for w in np.random.RandomState(seed)._bit_generator.random_raw(n)]


def masked_draws(ws, low, high, count):
    """randint(low, high + 1, size=count) by hand; returns (values, words used)."""
    span = high - low
    mask = (1 << span.bit_length()) - 1
    out, used = [], 0
    while len(out) < count:
        v = ws[used] & mask
        used += 1
        if v <= span:
            out.append(low + v)
    return out, used


def test_seed_1_random_lengths_are_bench_servings():
    """--random-input-len 1024 --random-output-len 1024 --random-range-ratio 0 --seed 1: lengths drawn from
    [max(int(1024 * 0), 1), 1024] = [1, 1024], mask 1023 (no rejection): 1 + (word & 1023)."""
    reqs = bench_requests("random-ids", 5, input_len=1024, output_len=1024, range_ratio=0.0, seed=1,
                          vocab_size=32000)
    assert [r.input_len for r in reqs] == [38, 236, 909, 73, 768]
    assert [r.output_len for r in reqs] == [906, 716, 646, 848, 961]
    ws = words(1, 10)
    assert ws[:2] == [1791095845, 4282876139]  # 1791095845 & 1023 = 37 -> 38; 4282876139 & 1023 = 235 -> 236
    assert [r.input_len for r in reqs] == [1 + (w & 1023) for w in ws[:5]]
    assert all(r.max_new_tokens == r.output_len and r.ignore_eos for r in reqs)  # bench_serving ignores EOS


def test_range_ratio_half_rejects_out_of_range_words():
    """Ratio 0.5 of 1024: [512, 1024], 513 values under mask 1023; words whose low 10 bits exceed 512 are
    skipped, so the output draws start wherever the input draws stopped."""
    reqs = bench_requests("random-ids", 8, input_len=1024, output_len=1024, range_ratio=0.5, seed=7,
                          vocab_size=32000)
    ws = words(7, 200)
    ins, used = masked_draws(ws, 512, 1024, 8)
    outs, _ = masked_draws(ws[used:], 512, 1024, 8)
    assert [r.input_len for r in reqs] == ins
    assert [r.output_len for r in reqs] == outs
    assert all(512 <= n <= 1024 for n in ins + outs)


def test_lower_bounds_and_the_vllm_meaning():
    rng = np.random.RandomState(0)
    assert random_lens(1, 0.0, 50, rng) == [1] * 50  # 0.5.23: output lower bound max(int(L*r), 1) = 1
    assert random_lens(300, 1.0, 20, rng) == [300] * 20  # --random-range-ratio 1: fixed lengths
    vllm = random_lens(100, 0.1, 2000, np.random.RandomState(0), style="vllm")
    assert min(vllm) == 90 and max(vllm) == 110  # [int(100*0.9), int(100*1.1)], both ends drawn
    # [max(int(4 * 0.1), 1), int(4 * 1.9)] = [1, 7]
    assert set(random_lens(4, 0.9, 200, np.random.RandomState(0), style="vllm")) == {1, 2, 3, 4, 5, 6, 7}


def test_random_ids_tokens_are_offset_plus_index_modulo_vocab():
    """Token j of request i is (offsets[i] + i + j) % vocab_size, offsets drawn after both length draws."""
    reqs = bench_requests("random-ids", 3, input_len=40, output_len=8, range_ratio=1.0, seed=3, vocab_size=50)
    ws = words(3, 20)
    # lengths are fixed (ratio 1: [40, 40] and [8, 8]): numpy returns low for an empty span without drawing,
    # so the offsets ([0, 49], mask 63) take the first words
    offsets, _ = masked_draws(ws, 0, 49, 3)
    for i, r in enumerate(reqs):
        assert r.input_len == 40 and r.output_len == 8
        assert r.token_ids.tolist() == [(offsets[i] + i + j) % 50 for j in range(40)]


def test_poisson_arrivals_from_the_first_words(sharegpt_file):
    """sharegpt draws nothing from numpy, so the first interval comes from words 0 and 1:
    u = ((a >> 5) * 2**26 + (b >> 6)) / 2**53, interval = -log(1 - u) / rate."""
    reqs = _sharegpt(sharegpt_file, seed=5, num=3, request_rate=4.0)
    a, b, c, d = words(5, 4)
    u1 = ((a >> 5) * 2**26 + (b >> 6)) / 2**53
    u2 = ((c >> 5) * 2**26 + (d >> 6)) / 2**53
    assert reqs[0].arrival_s == 0.0
    assert reqs[1].arrival_s == pytest.approx(-math.log(1 - u1) / 4.0, rel=1e-12)
    assert reqs[2].arrival_s == pytest.approx(-math.log(1 - u1) / 4.0 - math.log(1 - u2) / 4.0, rel=1e-12)


def test_rate_inf_sends_everything_at_once_and_burstiness_1_is_poisson():
    reqs = bench_requests("random-ids", 4, input_len=10, output_len=10, vocab_size=100)
    assert [r.arrival_s for r in reqs] == [0.0] * 4
    poisson = bench_requests("random-ids", 6, input_len=10, output_len=10, vocab_size=100, request_rate=3.0)
    gamma1 = bench_requests("random-ids", 6, input_len=10, output_len=10, vocab_size=100, request_rate=3.0,
                            burstiness=1.0 + 0.0)
    assert [r.arrival_s for r in poisson] == [r.arrival_s for r in gamma1]
    bursty = bench_requests("random-ids", 6, input_len=10, output_len=10, vocab_size=100, request_rate=3.0,
                            burstiness=0.5)
    assert [r.arrival_s for r in bursty] != [r.arrival_s for r in poisson]


CONVERSATIONS = [
    {"id": "a", "conversations": [{"from": "human", "value": "abcdefgh"}, {"from": "gpt", "value": "x" * 40}]},
    {"id": "b", "conversations": [{"from": "human", "value": "hi"}]},  # one turn: dropped
    {"id": "c", "conversations": [{"from": "human", "value": "q" * 12}, {"from": "gpt", "value": "ok"}]},
    {"id": "d", "conversations": [{"from": "human", "value": "z" * 400}, {"from": "gpt", "value": "y" * 400}]},
    {"id": "e", "conversation": [{"from": "human", "value": "k" * 20}, {"from": "gpt", "value": "w" * 24}]},
]


@pytest.fixture
def sharegpt_file(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(CONVERSATIONS))
    return path


def _sharegpt(path, seed=1, num=10, **kw):
    return bench_requests("sharegpt", num, seed=seed, sharegpt_path=path, **kw)


def shuffled_pairs(seed):
    """random.shuffle by hand: Fisher-Yates from the end, j = randbelow(i + 1) by getrandbits rejection."""
    pairs = [("abcdefgh", "x" * 40), ("q" * 12, "ok"), ("z" * 400, "y" * 400), ("k" * 20, "w" * 24)]
    rng = random.Random(seed)
    for i in reversed(range(1, len(pairs))):
        n = i + 1
        k = n.bit_length()
        j = rng.getrandbits(k)
        while j >= n:
            j = rng.getrandbits(k)
        pairs[i], pairs[j] = pairs[j], pairs[i]
    return pairs


def test_sharegpt_shuffles_filters_and_counts_bytes_over_4(sharegpt_file):
    """Lengths are ceil(utf8 bytes / 4): 'abcdefgh' 2, 40 x 10, 12 q 3, 'ok' 1 (< 2: pruned), 400 z 100,
    20 k 5, 24 w 6; a one-turn conversation is dropped before the shuffle."""
    lens = {"abcdefgh": (2, 10), "q" * 12: (3, 1), "z" * 400: (100, 100), "k" * 20: (5, 6)}
    want = [lens[p] for p, _ in shuffled_pairs(11) if lens[p][1] >= 2]
    reqs = _sharegpt(sharegpt_file, seed=11)
    assert [(r.input_len, r.output_len) for r in reqs] == want
    prompts = [p for p, _ in shuffled_pairs(11) if lens[p][1] >= 2]
    assert [r.segments for r in reqs] == [((message_segment("user", p), lens[p][0]),) for p in prompts]
    # --sharegpt-context-len 50 prunes prompt + output > 50 (the 400-byte pair); --sharegpt-output-len fixes outputs
    short = _sharegpt(sharegpt_file, seed=11, sharegpt_context_len=50, sharegpt_output_len=4)
    assert [(r.input_len, r.output_len) for r in short] == [(lens[p][0], 4) for p, _ in shuffled_pairs(11)
                                                             if lens[p][0] + 4 <= 50]
    assert len(_sharegpt(sharegpt_file, seed=11, num=2)) == 2


def test_random_repeats_or_cuts_the_sharegpt_prompt(sharegpt_file):
    """random: prompt i is the i-th shuffled ShareGPT prompt repeated, then cut, to the drawn length."""
    reqs = bench_requests("random", 4, input_len=7, output_len=5, range_ratio=1.0, seed=2,
                          sharegpt_path=sharegpt_file)
    prompts = [p for p, _ in shuffled_pairs(2)]
    plen = {"abcdefgh": 2, "q" * 12: 3, "z" * 400: 100, "k" * 20: 5}
    by_len = {2: ((2,) * 3 + (1,)), 3: (3, 3, 1), 100: (7,), 5: (5, 2)}
    for r, p in zip(reqs, prompts):
        seg = message_segment("user", p)
        assert r.input_len == 7 and r.output_len == 5
        assert r.segments == tuple((seg, n) for n in by_len[plen[p]])


def test_warmup_copies_the_first_prompt_and_asks_at_most_32_tokens():
    first = bench_requests("random-ids", 1, input_len=64, output_len=100, range_ratio=1.0, vocab_size=1000)[0]
    warm = warmup_requests(first, 3, rid_base=10)
    assert [w.rid for w in warm] == [10, 11, 12]
    assert all(np.array_equal(w.token_ids, first.token_ids) and w.output_len == 32 == w.max_new_tokens
               for w in warm)


def test_bad_arguments_name_the_flag(tmp_path):
    with pytest.raises(ValueError, match="--dataset-name"):
        bench_requests("mooncake", 3)
    with pytest.raises(ValueError, match="--dataset-path"):
        bench_requests("random", 3)
    with pytest.raises(ValueError, match="vocab_size"):
        bench_requests("random-ids", 3)
    with pytest.raises(ValueError, match="--random-range-ratio"):
        bench_requests("random-ids", 3, range_ratio=1.5, vocab_size=10)
    with pytest.raises(ValueError, match="--request-rate"):
        bench_requests("random-ids", 3, request_rate=0.0, vocab_size=10)
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi"}]}]))
    with pytest.raises(ValueError, match="no ShareGPT conversation"):
        bench_requests("sharegpt", 3, sharegpt_path=empty)
    bad = tmp_path / "bad.json"
    bad.write_text('[{"conversations": [}]')
    with pytest.raises(TraceFormatError, match="bad.json:1"):
        bench_requests("sharegpt", 3, sharegpt_path=bad)


def test_random_input_lens_match_the_published_totals():
    """bench_serving --seed 1 --dataset-name random printed these totals in the SGLang cookbook (Llama-3.1,
    DeepSeek-V3.1 pages): 10/80/500 prompts of --random-input-len 1000 and 10/80/320 of 8000."""
    def total(n, length):
        return sum(r.input_len for r in bench_requests("random", n, input_len=length, output_len=10, seed=1,
                                                       sharegpt_standin=True))
    assert [total(10, 1000), total(80, 1000), total(500, 1000)] == [6101, 39668, 249831]
    assert [total(10, 8000), total(80, 8000), total(320, 8000)] == [41941, 300020, 1273893]


def test_legacy_output_bound_matches_an_older_clients_published_totals():
    """An older bench_serving drew outputs from [int(L * r), L] (0 possible at ratio 0). Its --seed 1 runs of
    --random-input 1024 --random-output 1024 printed these totals (datacrunch-research/h200-benchmarks, commit
    c091ef5, sglang/outputs/llama_3_3_70b_online_output.jsonl): input/output tokens for 300 and 1200 prompts."""
    def totals(n, style):
        reqs = bench_requests("random", n, input_len=1024, output_len=1024, seed=1, request_rate=4.0,
                              sharegpt_standin=True, range_style=style)
        return sum(r.input_len for r in reqs), sum(r.output_len for r in reqs)
    assert totals(300, "sglang-legacy") == (152612, 160347)
    # 1200 prompts drew three 0-token outputs, which are sent as 1 token here: 607,936 published + 3
    assert totals(1200, "sglang-legacy") == (615860, 607936 + 3)
    assert totals(300, "sglang")[1] != 160347  # the 0.5.23 bound draws other outputs from the same stream
    assert random_lens(1, 0.0, 40, np.random.RandomState(0), style="sglang-legacy", output=True).count(0) > 0


def test_random_standin_prompts_repeat_across_runs_with_the_same_seed():
    """Prompt i is the i-th shuffled text in every run with the same seed: a 10-prompt run's prompts are the
    first 10 of an 80-prompt run's (same lengths, same text), and an 8000-token run's prompt i is the same text
    as a 1000-token run's prompt i, so the shorter is a prefix of the longer (one segment, cut)."""
    short = bench_requests("random", 10, input_len=1000, output_len=10, seed=1, sharegpt_standin=True)
    more = bench_requests("random", 80, input_len=1000, output_len=10, seed=1, sharegpt_standin=True)
    long = bench_requests("random", 10, input_len=8000, output_len=10, seed=1, sharegpt_standin=True)
    assert [r.segments for r in short] == [r.segments for r in more[:10]]
    assert [r.segments[0][0] for r in long] == [r.segments[0][0] for r in short]
    assert all(len(r.segments) == 1 and r.segments[0][1] == r.input_len for r in long)
    assert len({r.segments[0][0] for r in more}) == 80  # distinct texts within a run
    other = bench_requests("random", 10, input_len=1000, output_len=10, seed=2, sharegpt_standin=True)
    assert not {r.segments[0][0] for r in other} & {r.segments[0][0] for r in short}
