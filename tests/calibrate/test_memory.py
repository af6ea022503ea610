"""Calibration memory safety: the stand-in prefill attention in bounded query blocks, and the up-front check of
what a replay will allocate against what the device has."""

import pytest

torch = pytest.importorskip("torch")


def _case(seed=0):
    """Two prefill requests (one with a cached prefix, one a fresh prompt) and an empty one, on 4 q / 2 kv heads."""
    g = torch.Generator().manual_seed(seed)
    rows, width, hq, hkv, dk, dv = 4, 64, 4, 2, 16, 8
    k_buf = torch.randn(200, hkv, dk, generator=g)
    v_buf = torch.randn(200, hkv, dv, generator=g)
    req_to_token = torch.zeros(rows, width, dtype=torch.int32)
    req_to_token[1, :40] = torch.randperm(199, generator=g)[:40].int() + 1
    req_to_token[3, :23] = torch.randperm(199, generator=g)[:23].int() + 1
    ext_rows, prefix, extend = (torch.tensor(x) for x in ([1, 2, 3], [13, 0, 0], [27, 0, 23]))
    q = torch.randn(50, hq, dk, generator=g)
    return q, k_buf, v_buf, req_to_token, ext_rows, prefix, extend


def test_query_blocks_split_each_request_into_bounded_blocks():
    from kernels.standin import query_blocks

    rows, prefix, extend = (torch.tensor(x) for x in ([1, 2, 3], [13, 0, 0], [27, 0, 23]))
    # request 1: 40 keys, 4 heads: 4 * 4 * 40 = 640 score bytes per query row; 6400 bytes -> blocks of 10 rows
    # request 3: 23 keys: 368 bytes per row -> blocks of 17; the empty request 2 has none
    r, p, e = query_blocks(rows, prefix, extend, heads=4, max_bytes=6400)
    assert r.tolist() == [1, 1, 1, 3, 3]
    assert p.tolist() == [13, 23, 33, 0, 17]
    assert e.tolist() == [10, 10, 7, 17, 6]
    # a budget below one row still makes progress: one query row per block
    r, p, e = query_blocks(rows[:1], prefix[:1], extend[:1], heads=4, max_bytes=1)
    assert e.tolist() == [1] * 27 and p.tolist() == list(range(13, 40))


@pytest.mark.parametrize("max_bytes", [1, 6400, 1 << 30])
def test_blocked_prefill_attention_equals_the_whole(max_bytes):
    """The reference op over the query blocks gives the unblocked output (each query row sees the same keys)."""
    from kernels.ops.extend_attention import naive
    from kernels.standin import query_blocks

    q, k_buf, v_buf, table, rows, prefix, extend = _case()
    whole = naive.extend_attention(q, k_buf, v_buf, table, rows, prefix, extend)
    blocked = naive.extend_attention(q, k_buf, v_buf, table, *query_blocks(rows, prefix, extend, 4, max_bytes))
    torch.testing.assert_close(blocked, whole, rtol=1e-6, atol=1e-6)
