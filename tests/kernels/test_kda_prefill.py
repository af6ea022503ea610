"""kda_prefill: the chunked reference against the recurrent one, against decode steps, and by hand."""

import math

import pytest
import torch

from poolsim.kernels.ops.kda_decode import naive as decode_naive
from poolsim.kernels.ops.kda_prefill import naive
from tests.kernels.utils import DEVICE, assert_close, assert_rows_untouched, fused, poison_, randn


def _inputs(total, H, HV, K, V, dtype=torch.float32, seed=0, gate_shift=0.0):
    torch.manual_seed(seed)
    q, k = randn(total, H, K, dtype=dtype), randn(total, H, K, dtype=dtype)
    v = randn(total, HV, V, dtype=dtype)
    a = (randn(total, HV * K) + gate_shift).to(dtype)
    b = randn(total, HV, dtype=dtype)
    A_log, dt_bias = randn(HV) * 0.5, randn(HV * K) * 0.5
    return q, k, v, a, b, A_log, dt_bias


def _pool(num_slots, HV, V, K, slots, dtype=torch.float32):
    pool = poison_(torch.empty(num_slots, HV, V, K, device=DEVICE, dtype=dtype))
    live = slots[slots >= 0]
    pool[live] = randn(len(live), HV, V, K).to(dtype)
    return pool


def _cu(lens):
    return torch.tensor([0] + lens, device=DEVICE).cumsum(0)


def test_hand_two_tokens():
    # The 2x2 step of test_kda_decode.py::test_naive_hand_2x2 (o1 = [0.5303301, 0.7071068],
    # S1[k, v] = [[1.25, 2], [0.75, 1]]), then a second token with the same gate, beta and k, v = [1, 1]:
    #   decay:  S = [[0.625, 1], [0.1875, 0.25]];  S^T k = [0.625, 1];  u = 0.5 * ([1, 1] - [0.625, 1]) = [0.1875, 0]
    #   S2 = [[0.8125, 1], [0.1875, 0.25]];  q = [0, 0.7071068]:  o2 = [0.1875, 0.25] * 0.7071068 = [0.1325825, 0.1767767]
    t = lambda x: torch.tensor(x, dtype=torch.float64, device=DEVICE)
    q, k = t([[[0.0, 2.0]], [[0.0, 2.0]]]), t([[[1.0, 0.0]], [[1.0, 0.0]]])
    v = t([[[2.0, 3.0]], [[1.0, 1.0]]])
    a = t([[0.0, math.log(3.0)]] * 2)
    b, A_log, dt_bias = t([[0.0], [0.0]]), t([0.0]), t([0.0, 0.0])
    expected_o = t([[0.5303301, 0.7071068], [0.1325825, 0.1767767]])
    expected_state = t([[0.8125, 0.1875], [1.0, 0.25]])  # [V, K] as the pool stores it
    for impl in (naive.kda_prefill, naive.kda_prefill_recurrent):
        pool = torch.full((2, 1, 2, 2), float("nan"), dtype=torch.float64, device=DEVICE)
        pool[1, 0] = t([[1.0, 3.0], [2.0, 4.0]])
        o = impl(q, k, v, a, b, A_log, dt_bias, pool, torch.tensor([1], device=DEVICE), _cu([2]))
        torch.testing.assert_close(o[:, 0], expected_o, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(pool[1, 0], expected_state, rtol=1e-6, atol=1e-6)
        assert pool[0].isnan().all()


CASES = [
    # lens, H, HV, K, V, chunk
    ([63], 1, 1, 16, 16, 64),
    ([1, 64, 65, 130], 2, 2, 16, 24, 64),
    ([20, 7, 33], 2, 4, 24, 16, 16),
]


@pytest.mark.parametrize("gate_shift", [0.0, 30.0], ids=["gate", "strong-decay"])
@pytest.mark.parametrize("lens,H,HV,K,V,chunk", CASES,
                         ids=[f"T{sum(c[0])}-N{len(c[0])}-H{c[1]}-HV{c[2]}-K{c[3]}-V{c[4]}-C{c[5]}" for c in CASES])
def test_chunked_matches_recurrent(lens, H, HV, K, V, chunk, gate_shift):
    inputs = _inputs(sum(lens), H, HV, K, V, gate_shift=gate_shift)
    n = len(lens)
    slots = (torch.randperm(n + 3)[:n] + 1).to(DEVICE)
    if n > 2:
        slots[1] = -1
    pool = _pool(n + 4, HV, V, K, slots)
    before, ref_pool = pool.clone(), pool.clone()
    ref = naive.kda_prefill_recurrent(*inputs, ref_pool, slots, _cu(lens))
    out = naive.kda_prefill(*inputs, pool, slots, _cu(lens), chunk_size=chunk)
    assert_close("o", ref, out, 1e-5)
    live = slots[slots >= 0]
    assert_close("state", ref_pool[live], pool[live], 1e-5)
    assert_rows_untouched("pool", before, pool, live.tolist())


@pytest.mark.parametrize("decode", ["naive", "fused"])
def test_prefill_matches_decode_steps(decode):
    """Prefill of T tokens from a slot == T decode steps on that slot (one request, then two interleaved)."""
    T, H, HV, K, V = 5, 2, 2, 16, 16
    step = decode_naive.kda_decode if decode == "naive" else fused("kda_decode").kda_decode
    inputs = _inputs(2 * T, H, HV, K, V, seed=1)
    slots = torch.tensor([3, 1], device=DEVICE)
    pool = _pool(5, HV, V, K, slots)
    step_pool = pool.clone()
    o = naive.kda_prefill(*inputs, pool, slots, _cu([T, T]))
    for t in range(T):  # request 0 owns tokens 0..T-1, request 1 tokens T..2T-1
        rows = torch.tensor([t, T + t], device=DEVICE)
        o_t = step(*[x[rows] for x in inputs[:5]], *inputs[5:], step_pool, slots)
        assert_close(f"o step {t}", o[rows], o_t, 1e-5)
    assert_close("state", pool[slots], step_pool[slots], 1e-5)


def test_has_initial_state_false_starts_from_zero():
    inputs = _inputs(9, 1, 1, 16, 16, seed=2)
    slots = torch.tensor([2, 4], device=DEVICE)
    pool = _pool(5, 1, 16, 16, slots)
    fresh = pool.clone()
    fresh[2] = 0  # what request 0 sees when it has no cached prefix
    fresh_ref = fresh.clone()
    o = naive.kda_prefill(*inputs, pool, slots, _cu([4, 5]), has_initial_state=torch.tensor([False, True]))
    ref = naive.kda_prefill_recurrent(*inputs, fresh_ref, slots, _cu([4, 5]))
    assert_close("o", ref, o, 1e-5)
    assert_close("state", fresh_ref[slots], pool[slots], 1e-5)


@pytest.mark.parametrize("impl", ["chunked", "recurrent"])
def test_rejects(impl):
    fn = naive.kda_prefill if impl == "chunked" else naive.kda_prefill_recurrent
    inputs = _inputs(6, 1, 1, 16, 16)
    pool = torch.zeros(3, 1, 16, 16, device=DEVICE)
    with pytest.raises(ValueError, match="cu_seqlens"):
        fn(*inputs, pool, torch.tensor([1, 2], device=DEVICE), _cu([2, 3]))
    with pytest.raises(IndexError, match="slot_indices"):
        fn(*inputs, pool, torch.tensor([1, 3], device=DEVICE), _cu([2, 4]))
    assert (pool == 0).all()


@pytest.mark.gpu
def test_fla_chunk_kda_bf16_gpu():
    """fla-core's chunk_kda on pool slots against the torch chunked reference, Kimi-Linear head shapes."""
    lens, H, D = [1, 63, 700, 2048], 32, 128
    inputs = _inputs(sum(lens), H, H, D, D, dtype=torch.bfloat16, seed=3)
    slots = torch.tensor([5, -1, 2, 9], device="cuda")
    pool = _pool(12, H, D, D, slots) * 0.1
    pool[0] = 0
    ref_pool = pool.clone()
    has_init = torch.tensor([True, True, False, True], device="cuda")
    ref = naive.kda_prefill(*[x.float() for x in inputs], ref_pool, slots, _cu(lens), has_init)
    out = fused("kda_prefill").kda_prefill(*inputs, pool, slots, _cu(lens), has_init)
    assert_close("o", ref, out.float(), 2e-2)
    assert_close("state", ref_pool[slots[slots >= 0]], pool[slots[slots >= 0]], 2e-2)
