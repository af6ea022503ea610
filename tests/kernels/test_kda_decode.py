"""kda_decode: one KDA step per request, in place on the ``[slots, HV, V, K]`` state pool."""

import math

import pytest
import torch

from poolsim.kernels.ops.kda_decode import naive
from poolsim.pools import MambaCacheParams, MambaPool, MambaStateShape
from tests.kernels.utils import DEVICE, assert_close, assert_rows_untouched, fused, poison_, randn


def _hand_inputs(dtype=torch.float64):
    t = lambda x: torch.tensor(x, dtype=dtype, device=DEVICE)
    q, k = t([[[0.0, 2.0]]]), t([[[1.0, 0.0]]])
    v = t([[[2.0, 3.0]]])
    a = t([[0.0, math.log(3.0)]])
    b = t([[0.0]])
    A_log, dt_bias = t([0.0]), t([0.0, 0.0])
    return q, k, v, a, b, A_log, dt_bias


def test_naive_hand_2x2():
    # K = V = 2, one head. Gate: A_log = 0, dt_bias = 0, a = [0, ln 3]:
    #   g = -softplus(a) = [-ln 2, -ln 4]  ->  exp(g) = [0.5, 0.25];  beta = sigmoid(0) = 0.5.
    # State S[k, v] = [[1, 2], [3, 4]]; the pool holds S^T = [[1, 3], [2, 4]].
    #   decay rows:   S = [[0.5, 1], [0.75, 1]]
    #   k = l2norm([1, 0]) = [1, 0]:  S^T k = [0.5, 1];  u = 0.5 * ([2, 3] - [0.5, 1]) = [0.75, 1]
    #   S + k u^T = [[1.25, 2], [0.75, 1]]
    #   q = l2norm([0, 2]) * 2^-1/2 = [0, 0.7071068]:  o = S^T q = [0.75, 1] * 0.7071068 = [0.5303301, 0.7071068]
    # (l2norm adds 1e-6 under the root: a relative 5e-7 off these numbers)
    pool = torch.full((3, 1, 2, 2), float("nan"), dtype=torch.float64, device=DEVICE)
    pool[2, 0] = torch.tensor([[1.0, 3.0], [2.0, 4.0]])
    o = naive.kda_decode(*_hand_inputs(), pool, torch.tensor([2], device=DEVICE))
    torch.testing.assert_close(o[0, 0], torch.tensor([0.5303301, 0.7071068], dtype=torch.float64, device=DEVICE),
                               rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(pool[2, 0], torch.tensor([[1.25, 0.75], [2.0, 1.0]], dtype=torch.float64,
                                                        device=DEVICE), rtol=1e-6, atol=1e-6)
    assert pool[:2].isnan().all()


@pytest.mark.parametrize("impl", ["naive", "fused"])
def test_padding_slot_outputs_zeros(impl):
    # SGLang 0.5.23's CUDA decode (fused_recurrent_kda_packed_decode, fla/fused_recurrent.py:458-463): a slot < 0
    # stores a zero output and returns before reading or writing the state. The same inputs from a zero state
    # would give o = S^T k = u = [1, 1.5] (q = k, scale 1), so the zeros are not the zero-state step's output.
    mod = naive if impl == "naive" else fused("kda_decode")
    dtype = torch.float64 if impl == "naive" else torch.float32  # the interpreter's kernels run fp32
    pool = torch.full((2, 1, 2, 2), float("nan"), dtype=dtype, device=DEVICE)
    _, k, v, a, b, A_log, dt_bias = _hand_inputs(dtype)
    o = mod.kda_decode(k, k, v, a, b, A_log, dt_bias, pool, torch.tensor([-1], device=DEVICE), scale=1.0)
    assert o.tolist() == [[[0.0, 0.0]]] and pool.isnan().all()
    # beside a live request: the live row is the usual step, the padded row zeros
    pool[1, 0] = torch.tensor([[1.0, 3.0], [2.0, 4.0]], dtype=dtype)
    two = [torch.cat([x, x]) for x in (k, k, v, a, b)]
    o = mod.kda_decode(*two, A_log, dt_bias, pool, torch.tensor([-1, 1], device=DEVICE), scale=1.0)
    assert o[0].tolist() == [[0.0, 0.0]] and not (o[1] == 0).any() and pool[0].isnan().all()


def _inputs(N, H, HV, K, V, dtype, seed=0):
    torch.manual_seed(seed)
    q, k = randn(N, H, K, dtype=dtype), randn(N, H, K, dtype=dtype)
    v = randn(N, HV, V, dtype=dtype)
    a, b = randn(N, HV * K, dtype=dtype), randn(N, HV, dtype=dtype)
    A_log, dt_bias = randn(HV) * 0.5, randn(HV * K) * 0.5
    return q, k, v, a, b, A_log, dt_bias


CASES = [(1, 1, 1, 16, 16), (3, 2, 4, 24, 40), (5, 3, 3, 32, 20), (4, 2, 2, 128, 128)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("N,H,HV,K,V", CASES, ids=[f"N{c[0]}-H{c[1]}-HV{c[2]}-K{c[3]}-V{c[4]}" for c in CASES])
def test_kda_decode(N, H, HV, K, V, dtype):
    inputs = _inputs(N, H, HV, K, V, dtype)
    pool = poison_(torch.empty(2 * N + 3, HV, V, K, device=DEVICE))  # guard slots stay NaN
    slots = torch.randperm(2 * N + 2)[:N].to(DEVICE) + 1
    if N > 1:
        slots[1] = -1  # a padded request
    live = slots[slots >= 0]
    pool[live] = randn(len(live), HV, V, K)
    before = pool.clone()
    ref_pool, out_pool = pool.clone(), pool.clone()
    ref = naive.kda_decode(*inputs, ref_pool, slots)
    out = fused("kda_decode").kda_decode(*inputs, out_pool, slots)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    assert_close("o", ref.float(), out.float(), tol)
    assert_close("state", ref_pool[live], out_pool[live], 1e-5)
    assert_rows_untouched("pool", before, out_pool, live.tolist())
    assert not torch.equal(out_pool[live], before[live])
    assert (out[slots < 0] == 0).all()


def test_kda_decode_on_mamba_pool_layer():
    """The real pool layout: one layer of ``MambaPool.temporal`` ``[layers, size+1, H, D, D]``, three steps."""
    H, D, N = 2, 16, 3
    params = MambaCacheParams(MambaStateShape.kimi_linear(tp=1, num_heads=H, head_dim=D), layers=[0, 2, 4])
    pool = MambaPool(6, params, device=DEVICE)
    poison_(pool.temporal)
    slots = torch.tensor([4, 1, 6], device=DEVICE)
    pool.temporal[1, slots] = randn(N, H, D, D)
    ref_states = pool.temporal.clone()
    before = pool.temporal.clone()
    kf = fused("kda_decode")
    for step in range(3):
        inputs = _inputs(N, H, H, D, D, torch.float32, seed=step)
        ref = naive.kda_decode(*inputs, ref_states[1], slots)
        out = kf.kda_decode(*inputs, pool.temporal[1], slots)
        assert_close(f"o step {step}", ref, out, 1e-5)
    assert_close("states", ref_states[1, slots], pool.temporal[1, slots], 1e-5)
    assert_rows_untouched("layer 1", before[1], pool.temporal[1], slots.tolist())
    for layer in (0, 2):
        assert pool.temporal[layer].isnan().all()


@pytest.mark.parametrize("impl", ["naive", "fused"])
def test_rejects(impl):
    mod = naive if impl == "naive" else fused("kda_decode")
    inputs = _inputs(2, 1, 1, 16, 16, torch.float32)
    pool = torch.zeros(4, 1, 16, 16, device=DEVICE)
    with pytest.raises(IndexError, match="slot_indices"):
        mod.kda_decode(*inputs, pool, torch.tensor([1, 4], device=DEVICE))
    with pytest.raises(ValueError, match="repeats a slot"):
        mod.kda_decode(*inputs, pool, torch.tensor([2, 2], device=DEVICE))
    with pytest.raises(ValueError, match="ssm_states must be"):
        mod.kda_decode(*inputs, pool.transpose(2, 3)[:, :, :8], torch.tensor([1, 2], device=DEVICE))
    assert (pool == 0).all()


@pytest.mark.gpu
def test_kda_decode_bf16_gpu():
    """Kimi-Linear shapes (H = 32, K = V = 128), bf16 activations, fp32 pool."""
    N, H, D = 64, 32, 128
    inputs = _inputs(N, H, H, D, D, torch.bfloat16)
    pool = torch.randn(300, H, D, D, device="cuda") * 0.1
    slots = (torch.randperm(299, device="cuda")[:N] + 1)
    slots[::7] = -1
    ref_pool = pool.clone()
    ref = naive.kda_decode(*[t.float() for t in inputs], ref_pool, slots)
    out = fused("kda_decode").kda_decode(*inputs, pool, slots)
    assert_close("o", ref, out.float(), 1e-2)
    assert_close("state", ref_pool, pool, 1e-3)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize("lens", [[1, 1, 1], [5, 1, 12]], ids=["decode", "varlen"])
def test_references_match_fla_fused_recurrent(lens):
    """An independent implementation: fla-core's recurrent KDA kernel, in place on the V-first pool through
    ``ssm_state_indices`` (the interpreter runs it on CPU), against the decode and the chunked prefill references."""
    pytest.importorskip("fla")
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    from poolsim.kernels.ops.kda_prefill import naive as prefill_naive

    H, HV, K, V = 2, 4, 16, 24
    q, k, v, a, b, A_log, dt_bias = _inputs(sum(lens), H, HV, K, V, torch.float32, seed=7)
    slots = torch.tensor([4, 1, 2], device=DEVICE)
    pool = torch.randn(6, HV, V, K, device=DEVICE)
    fla_pool, ref_pool = pool.clone(), pool.clone()
    cu = torch.tensor([0] + lens, device=DEVICE).cumsum(0)
    gate = {"A_log": A_log, "dt_bias": dt_bias, "cu_seqlens": cu, "state_v_first": True,
            "use_qk_l2norm_in_kernel": True, "use_gate_in_kernel": True, "use_beta_sigmoid_in_kernel": True}
    args = (q[None], k[None], v[None], a.view(1, -1, HV, K), b[None])
    if lens == [1, 1, 1]:  # fla's continuous-batching mode: one token per request, in place through the indices
        o, _ = fused_recurrent_kda_fwd(*args, initial_state=fla_pool, inplace_final_state=True,
                                       ssm_state_indices=slots.int(), **gate)
        ref = naive.kda_decode(q, k, v, a, b, A_log, dt_bias, ref_pool, slots)
    else:  # there fla's indices name one slot per token, so hand it per-sequence states instead
        o, final = fused_recurrent_kda_fwd(*args, initial_state=fla_pool[slots].clone(), inplace_final_state=False,
                                           output_final_state=True, **gate)
        fla_pool[slots] = final
        ref = prefill_naive.kda_prefill(q, k, v, a, b, A_log, dt_bias, ref_pool, slots, cu, chunk_size=4)
    assert_close("o", ref, o[0], 1e-5)
    assert_close("state", ref_pool, fla_pool, 1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_state_pool(dtype):
    """A bf16/fp16 state pool (``--mamba-ssm-dtype``): fp32 math, the state rounded on store, as the reference."""
    from poolsim.kernels.ops.kda_decode import naive

    torch.manual_seed(5)
    n, h, kd = 3, 2, 16
    q, k, v = (torch.randn(n, h, kd, device=DEVICE) for _ in range(3))
    a, b = torch.randn(n, h * kd, device=DEVICE), torch.randn(n, h, device=DEVICE)
    A_log, dt_bias = torch.rand(h, device=DEVICE), torch.rand(h * kd, device=DEVICE)
    pool = torch.randn(6, h, kd, kd, device=DEVICE).to(dtype)
    ref_pool = pool.clone()
    slots = torch.tensor([1, -1, 4], device=DEVICE)
    o = fused("kda_decode").kda_decode(q, k, v, a, b, A_log, dt_bias, pool, slots)
    ref = naive.kda_decode(q, k, v, a, b, A_log, dt_bias, ref_pool, slots)
    assert_close("o", ref, o, 1e-4)
    assert pool.dtype == dtype
    assert_close("state", ref_pool.float(), pool.float(), 1e-2)  # one rounding of the same fp32 value
