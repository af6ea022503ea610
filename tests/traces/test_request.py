"""The Request record and its token-id encoding (traces/README.md, "Token-id encoding")."""

import dataclasses

import numpy as np
import pytest

from poolsim.traces import Request, RequestError, fold_segment_id, segment_tokens

MIB = 1 << 20  # 1,048,576: tokens per segment


def test_segment_tokens_exact_ids():
    # token i of segment s is s * 2**20 + i
    assert segment_tokens(((3, 4), (7, 2))).tolist() == [3145728, 3145729, 3145730, 3145731, 7340032, 7340033]
    assert segment_tokens(((3, 4), (7, 2))).dtype == np.int64


# written out by hand: token i of segment s is s * 2**20 + i
@pytest.mark.parametrize("segments, expected", [
    # equal blocks and a shorter tail: the broadcast path
    (((3, 2), (7, 2), (9, 1)), [3 * MIB, 3 * MIB + 1, 7 * MIB, 7 * MIB + 1, 9 * MIB]),
    # equal blocks throughout: the broadcast path
    (((3, 2), (7, 2), (9, 2)), [3 * MIB, 3 * MIB + 1, 7 * MIB, 7 * MIB + 1, 9 * MIB, 9 * MIB + 1]),
    # a short block in the middle: the general path
    (((3, 2), (7, 1), (9, 2)), [3 * MIB, 3 * MIB + 1, 7 * MIB, 9 * MIB, 9 * MIB + 1]),
    # a longer tail: the general path
    (((3, 1), (7, 2)), [3 * MIB, 7 * MIB, 7 * MIB + 1]),
    # one segment
    (((3, 3),), [3 * MIB, 3 * MIB + 1, 3 * MIB + 2]),
])
def test_segment_tokens_exact_ids_on_both_paths(segments, expected):
    got = segment_tokens(segments)
    assert got.tolist() == expected and got.dtype == np.int64 and got.ndim == 1


# written out by hand: a tail (s, n) appends s * 2**20 + [0, n) after the prompt's ids
@pytest.mark.parametrize("segments, tail, expected", [
    # broadcast path, shorter last block: the tail starts right after it, inside the last block's grid row
    (((3, 2), (7, 2), (9, 1)), (5, 3), [3 * MIB, 3 * MIB + 1, 7 * MIB, 7 * MIB + 1, 9 * MIB,
                                        5 * MIB, 5 * MIB + 1, 5 * MIB + 2]),
    # broadcast path, full last block
    (((3, 2), (7, 2)), (5, 1), [3 * MIB, 3 * MIB + 1, 7 * MIB, 7 * MIB + 1, 5 * MIB]),
    # general path (one segment)
    (((3, 2),), (5, 2), [3 * MIB, 3 * MIB + 1, 5 * MIB, 5 * MIB + 1]),
    # an empty tail adds nothing
    (((3, 2), (7, 1)), (5, 0), [3 * MIB, 3 * MIB + 1, 7 * MIB]),
])
def test_segment_tokens_with_a_tail(segments, tail, expected):
    got = segment_tokens(segments, tail)
    assert got.tolist() == expected and got.dtype == np.int64 and got.ndim == 1


def test_tokens_with_output_is_the_prompt_then_the_outputs():
    r = Request(rid=3, arrival_s=0.0, input_len=600, output_len=4, segments=((5, 512), (9, 88)))
    got = r.tokens_with_output(3)
    assert got[:600].tolist() == [5 * MIB + i for i in range(512)] + [9 * MIB + i for i in range(88)]
    # (2**42 + 2*3 + 1) * 2**20 = 2**62 + 7340032, the private output segment
    assert got[600:].tolist() == [4611686018434727936 + i for i in range(3)]
    explicit = Request(rid=3, arrival_s=0.0, input_len=2, output_len=4, token_ids=[11, 12])
    assert explicit.tokens_with_output(2).tolist() == [11, 12, 4611686018434727936, 4611686018434727937]


def test_partial_block_is_a_prefix_of_the_full_block():
    partial = Request(rid=0, arrival_s=0.0, input_len=612, output_len=1, segments=((5, 512), (9, 100)))
    full = Request(rid=1, arrival_s=0.0, input_len=1024, output_len=1, segments=((5, 512), (9, 512)))
    assert np.array_equal(partial.prompt_tokens(), full.prompt_tokens()[:612])
    assert partial.prompt_tokens()[-1] == 9 * MIB + 99 == 9437283
    assert full.prompt_tokens()[612] == 9 * MIB + 100


def test_private_prompt_and_output_ids():
    r = Request(rid=3, arrival_s=0.0, input_len=4, output_len=2)
    # (2**42 + 2*3) * 2**20 = 2**62 + 6 * 2**20 = 4611686018427387904 + 6291456
    assert r.prompt_tokens().tolist() == [4611686018433679360 + i for i in range(4)]
    # (2**42 + 2*3 + 1) * 2**20 = 2**62 + 7340032
    assert r.output_tokens(3).tolist() == [4611686018434727936 + i for i in range(3)]


def test_largest_private_token_id_is_below_2_63():
    r = Request(rid=2**41 - 1, arrival_s=0.0, input_len=1, output_len=MIB)
    assert int(r.output_tokens(MIB)[-1]) == 2**63 - 1  # (2**43 - 1) * 2**20 + 2**20 - 1
    with pytest.raises(RequestError, match="'rid'"):
        Request(rid=2**41, arrival_s=0.0, input_len=1, output_len=1)


def test_output_segment_gives_the_generated_ids():
    r = Request(rid=0, arrival_s=0.0, input_len=2, output_len=3, segments=((1, 2),), output_segment=11)
    assert r.output_tokens(3).tolist() == [11534336, 11534337, 11534338]
    assert r.output_tokens(0).tolist() == []


def test_explicit_token_ids_are_used_as_they_are_and_read_only():
    ids = [5, 17, 5, 0]
    r = Request(rid=0, arrival_s=0.0, input_len=4, output_len=1, token_ids=ids)
    assert r.prompt_tokens().tolist() == ids
    assert r.prompt_tokens().dtype == np.int64
    with pytest.raises(ValueError):
        r.prompt_tokens()[0] = 1
    assert r == Request(rid=0, arrival_s=0.0, input_len=4, output_len=1, token_ids=np.array(ids))
    assert r != Request(rid=0, arrival_s=0.0, input_len=4, output_len=1, token_ids=[5, 17, 5, 1])


def _splitmix64_top42(x):
    """The documented fold, written with numpy uint64 arithmetic (wrapping) instead of Python ints."""
    with np.errstate(over="ignore"):
        x = np.uint64(x % 2**64)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return int(x >> np.uint64(22))


@pytest.mark.parametrize("raw", [2**42, 2**64 - 1, -1, -(2**63), 123456789012345678901234567890])
def test_fold_of_large_and_negative_hashes(raw):
    folded = fold_segment_id(raw)
    assert 0 <= folded < 2**42
    assert folded == _splitmix64_top42(raw)


def test_fold_keeps_ids_in_range_and_is_mod_2_64():
    assert [fold_segment_id(h) for h in (0, 5, 2**42 - 1)] == [0, 5, 2**42 - 1]
    assert fold_segment_id(-1) == fold_segment_id(2**64 - 1)
    assert len({fold_segment_id(2**42 + i) for i in range(1000)}) == 1000


@pytest.mark.parametrize("kwargs, field", [
    (dict(input_len=0), "input_len"),
    (dict(output_len=0), "output_len"),
    (dict(output_len=2**20 + 1), "output_len"),
    (dict(arrival_s=-1.0), "arrival_s"),
    (dict(arrival_s=float("nan")), "arrival_s"),
    (dict(max_new_tokens=4, output_len=5), "output_len"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(turn=-1), "turn"),
    (dict(segments=((1, 3),)), "segments"),  # sums to 3, not 4
    (dict(segments=((2**42, 4),)), "segments"),
    (dict(segments=((1, 0), (2, 4))), "segments"),
    (dict(segments=((1, 4),), token_ids=[1, 2, 3, 4]), "segments"),
    (dict(token_ids=[1, 2, 3]), "token_ids"),
    (dict(token_ids=[1, 2, 3, 2**62]), "token_ids"),
    (dict(token_ids=[1, 2, 3, 2**70]), "token_ids"),
    (dict(token_ids=[1, 2, 3, 4], output_segment=3), "output_segment"),
    (dict(input_len=2**20 + 1), "input_len"),  # a private prompt is one segment
    (dict(session_id=7), "session_id"),
])
def test_inconsistent_requests_name_the_field(kwargs, field):
    base = dict(rid=0, arrival_s=0.0, input_len=4, output_len=1)
    with pytest.raises(RequestError) as e:
        Request(**{**base, **kwargs})
    assert e.value.field == field


def test_a_long_prompt_with_segments_is_fine():
    r = Request(rid=0, arrival_s=0.0, input_len=3 * MIB, output_len=1, segments=((1, MIB),) * 3)
    assert len(r.prompt_tokens()) == 3 * MIB


def test_replace_revalidates():
    r = Request(rid=0, arrival_s=0.0, input_len=4, output_len=1)
    assert dataclasses.replace(r, rid=5).prompt_tokens()[0] == (2**42 + 10) * MIB
    with pytest.raises(RequestError):
        dataclasses.replace(r, input_len=0)


@pytest.mark.parametrize("form", [tuple, lambda s: [list(p) for p in s], np.array])
def test_segment_tokens_reads_any_pair_container_on_the_broadcast_path(form):
    segments = ((3, 2), (7, 2), (9, 1))  # equal blocks and a shorter tail
    got = segment_tokens(form(segments), (5, 1))
    assert got.tolist() == [3 * MIB, 3 * MIB + 1, 7 * MIB, 7 * MIB + 1, 9 * MIB, 5 * MIB]
