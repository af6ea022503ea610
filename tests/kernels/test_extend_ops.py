"""extend_attention and conv1d_prefill: the prefill ops the device replay runs, checked by hand and against the
decode ops applied one token at a time."""

import pytest
import torch

from poolsim import kernels
from poolsim.kernels.ops.conv1d_prefill import naive as conv_naive
from poolsim.kernels.ops.conv1d_update.naive import conv1d_update
from poolsim.kernels.ops.decode_attention.naive import decode_attention
from poolsim.kernels.ops.extend_attention import naive as extend_naive
from tests.kernels.utils import DEVICE, assert_close, assert_rows_untouched, fused, poison_, randn


def _conv_impl(impl):
    return conv_naive if impl == "naive" else fused("conv1d_prefill")


@pytest.mark.parametrize("impl", ["naive", "fused"])
def test_conv1d_prefill_hand(impl):
    conv1d_prefill = _conv_impl(impl).conv1d_prefill
    # width 2, weight [0.5, 1.0], state [2], tokens [1, 3], no bias, no activation:
    #   y0 = 0.5*2 + 1*1 = 2.0;  y1 = 0.5*1 + 1*3 = 3.5;  state <- [3]
    state = torch.tensor([[[0.0]], [[2.0]]], device=DEVICE)
    y = conv1d_prefill(torch.tensor([[1.0], [3.0]], device=DEVICE), state, torch.tensor([[0.5, 1.0]], device=DEVICE),
                       None, torch.tensor([1], device=DEVICE), torch.tensor([0, 2], device=DEVICE), None, None)
    assert y.flatten().tolist() == [2.0, 3.5]
    assert state.flatten().tolist() == [0.0, 3.0]
    # without an initial state the window starts from zeros: y0 = 1, y1 = 3.5
    y = conv1d_prefill(torch.tensor([[1.0], [3.0]], device=DEVICE), state, torch.tensor([[0.5, 1.0]], device=DEVICE),
                       None, torch.tensor([1], device=DEVICE), torch.tensor([0, 2], device=DEVICE),
                       torch.tensor([False], device=DEVICE), None)
    assert y.flatten().tolist() == [1.0, 3.5]


@pytest.mark.parametrize("impl", ["naive", "fused"])
def test_conv1d_prefill_equals_token_by_token_updates(impl):
    torch.manual_seed(0)
    dim, width, lens, slots = 6, 4, [5, 1, 3], [3, -1, 1]
    x = torch.randn(sum(lens), dim, device=DEVICE)
    weight, bias = torch.randn(dim, width, device=DEVICE), torch.randn(dim, device=DEVICE)
    state = torch.randn(5, dim, width - 1, device=DEVICE)
    ref_state = state.clone()
    cu = torch.tensor([0, 5, 6, 9], device=DEVICE)
    y = _conv_impl(impl).conv1d_prefill(x, state, weight, bias, torch.tensor(slots, device=DEVICE), cu)
    start = 0
    for n, s in zip(lens, slots):
        for t in range(start, start + n):
            if s >= 0:
                want = conv1d_update(x[t:t + 1], ref_state, weight, bias, torch.tensor([s], device=DEVICE))
                torch.testing.assert_close(y[t], want[0], rtol=1e-5, atol=1e-5)
            else:  # padding (slot -1): nothing read or stored; zero rows (SGLang leaves them unwritten)
                assert (y[t] == 0).all()
        start += n
    torch.testing.assert_close(state, ref_state)  # slot 0, 2, 4 untouched; 1 and 3 hold the last W-1 inputs


CONV_CASES = [  # (lens, dim, width, bias, activation, has_init, state dtype)
    ([40, 1, 2, 17], 130, 4, True, "silu", [True, False, True, True], torch.float32),
    ([3, 33], 24, 5, False, None, None, torch.float32),
    ([1, 0, 20], 96, 2, True, "silu", [False, True, True], torch.bfloat16),
]


@pytest.mark.parametrize("lens,dim,width,bias,activation,has_init,state_dtype", CONV_CASES,
                         ids=["W4-multiblock", "W5-linear", "W2-bf16-empty-seq"])
def test_conv1d_prefill_fused_matches_reference(lens, dim, width, bias, activation, has_init, state_dtype):
    """Several token and channel blocks, sequences shorter than the window (the new state keeps part of the old),
    a zero-length sequence, no initial state, a padded slot, SGLang's transposed pool view ``[slots, dim, W-1]``."""
    torch.manual_seed(3)
    n = len(lens)
    pool = poison_(torch.empty(n + 4, width - 1, dim, device=DEVICE, dtype=state_dtype))  # the pool's own layout
    slots = (torch.randperm(n + 3)[:n] + 1).to(DEVICE)
    slots[-2] = -1
    live = slots[slots >= 0]
    pool[live] = randn(len(live), width - 1, dim, dtype=state_dtype)
    before, ref_pool = pool.clone(), pool.clone()
    x = randn(sum(lens), dim)
    weight, b = randn(dim, width), randn(dim) if bias else None
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device=DEVICE)
    init = torch.tensor(has_init, device=DEVICE) if has_init is not None else None
    ref = conv_naive.conv1d_prefill(x, ref_pool.transpose(-1, -2), weight, b, slots, cu, init, activation)
    out = fused("conv1d_prefill").conv1d_prefill(x, pool.transpose(-1, -2), weight, b, slots, cu, init, activation)
    assert_close("y", ref, out, 1e-5)
    padded = torch.cat([torch.full((n_,), bool(s < 0)) for n_, s in zip(lens, slots.tolist())]).to(DEVICE)
    assert (out[padded] == 0).all()
    # a bf16 state is one rounding of the same fp32 value (the interpreter may round differently from torch)
    assert_close("state", ref_pool[live].float(), pool[live].float(), 1e-6 if state_dtype == torch.float32 else 1e-2)
    assert_rows_untouched("pool", before, pool, live.tolist())


@pytest.mark.parametrize("impl", ["naive", "fused"])
def test_extend_attention_equals_decode_per_token(impl):
    extend_attention = extend_naive.extend_attention if impl == "naive" else fused("extend_attention").extend_attention
    torch.manual_seed(1)
    rows, hkv, group, dk, dv = 40, 2, 2, 8, 8
    k_buf, v_buf = torch.randn(rows, hkv, dk, device=DEVICE), torch.randn(rows, hkv, dv, device=DEVICE)
    req_to_token = torch.zeros(4, 16, dtype=torch.int32, device=DEVICE)
    req_to_token[1, :9] = torch.randperm(rows - 1)[:9].int() + 1
    req_to_token[3, :4] = torch.randperm(rows - 1)[:4].int() + 1
    pool_idx, prefix, extend = [3, 1], [0, 6], [4, 3]
    q = torch.randn(sum(extend), hkv * group, dk, device=DEVICE)
    o = extend_attention(q, k_buf, v_buf, req_to_token, torch.tensor(pool_idx, device=DEVICE),
                         torch.tensor(prefix, device=DEVICE), torch.tensor(extend, device=DEVICE))
    t = 0
    for row, p, e in zip(pool_idx, prefix, extend):
        for j in range(e):  # token j of the new part sees p + j + 1 keys
            want = decode_attention(q[t:t + 1], k_buf, v_buf, req_to_token, torch.tensor([row], device=DEVICE),
                                    torch.tensor([p + j + 1], device=DEVICE))
            torch.testing.assert_close(o[t], want[0], rtol=1e-5, atol=1e-5)
            t += 1


EXTEND_CASES = [  # name, Hq, Hkv, DK, DV, prefix_lens, extend_lens, dtype, kv_dtype
    ("GQA-prefix", 4, 2, 16, 16, [0, 21, 5], [37, 3, 0], torch.float32, None),
    ("MHA-fp16", 2, 2, 24, 40, [40, 0], [18, 1], torch.float16, None),
    ("MLA-like", 3, 1, 48, 32, [7], [20], torch.float32, None),
    ("GQA-fp8", 4, 1, 16, 16, [9, 0], [17, 4], torch.float32, torch.float8_e4m3fn),
]


@pytest.mark.parametrize("case", EXTEND_CASES, ids=[c[0] for c in EXTEND_CASES])
def test_extend_attention_fused_matches_reference(case):
    """Several query blocks per request, a prefix longer than a key block, an empty extend, DK off a power of two
    (MLA's latent + rope split into two dot products), V narrower/wider than K, an fp8 cache in uint8 buffers."""
    _, hq, hkv, dk, dv, prefix, extend, dtype, kv_dtype = case
    torch.manual_seed(4)
    n, rows = len(prefix), sum(prefix) + sum(extend) + 6
    store = torch.uint8 if kv_dtype is not None else dtype
    k_buf = poison_(torch.empty(rows, hkv, dk, dtype=store, device=DEVICE))  # rows no request uses stay poisoned
    v_buf = poison_(torch.empty(rows, hkv, dv, dtype=store, device=DEVICE))
    table = poison_(torch.empty(n + 2, 64, dtype=torch.int32, device=DEVICE))
    pool_idx = (torch.randperm(n + 1)[:n] + 1).to(DEVICE)
    slots = (torch.randperm(rows - 1) + 1).to(DEVICE)
    used = 0
    for r, p, e in zip(pool_idx.tolist(), prefix, extend):
        table[r, :p + e] = slots[used:used + p + e].int()
        used += p + e
    live = slots[:used]
    k_new, v_new = randn(used, hkv, dk), randn(used, hkv, dv)
    if kv_dtype is not None:
        k_buf[live], v_buf[live] = k_new.to(kv_dtype).view(torch.uint8), v_new.to(kv_dtype).view(torch.uint8)
    else:
        k_buf[live], v_buf[live] = k_new.to(dtype), v_new.to(dtype)
    q = randn(sum(extend), hq, dk, dtype=dtype)
    args = (q, k_buf, v_buf, table, pool_idx, torch.tensor(prefix, device=DEVICE), torch.tensor(extend, device=DEVICE))
    ref = extend_naive.extend_attention(*args, kv_dtype=kv_dtype)
    out = fused("extend_attention").extend_attention(*args, kv_dtype=kv_dtype)
    assert out.dtype == dtype and out.shape == (sum(extend), hq, dv)
    assert_close("o", ref.float(), out.float(), 1e-5 if dtype == torch.float32 else 2e-3)


def test_extend_attention_rejects_a_short_q():
    buf = torch.zeros(8, 1, 4)
    with pytest.raises(ValueError, match="extends 3"):
        extend_naive.extend_attention(torch.zeros(2, 1, 4), buf, buf, torch.zeros(2, 8, dtype=torch.int32),
                                      torch.tensor([1]), torch.tensor([0]), torch.tensor([3]))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["gqa", "mla", "gqa-fp8"])
def test_extend_attention_bf16_gpu(kind):
    """Llama-3.1-8B (32 q heads on 8 KV heads of 128) and Kimi-Linear MLA (latent 512 + rope 64) at prefill lengths."""
    torch.manual_seed(5)
    prefix, extend = [0, 700, 3000], [512, 64, 1000]
    rows, n = sum(prefix) + sum(extend) + 1, len(prefix)
    hq, hkv, dk, dv = (32, 8, 128, 128) if kind != "mla" else (16, 1, 576, 512)
    fp8 = torch.float8_e4m3fn if kind == "gqa-fp8" else None
    k_buf = torch.randn(rows, hkv, dk, device="cuda").to(fp8 or torch.bfloat16)
    v_buf = k_buf[..., :dv] if kind == "mla" else torch.randn(rows, hkv, dv, device="cuda").to(fp8 or torch.bfloat16)
    table = torch.zeros(n + 1, 4096, dtype=torch.int32, device="cuda")
    slots, used = torch.randperm(rows - 1, device="cuda") + 1, 0
    for r, (p, e) in enumerate(zip(prefix, extend), start=1):
        table[r, :p + e] = slots[used:used + p + e].int()
        used += p + e
    q = torch.randn(sum(extend), hq, dk, device="cuda", dtype=torch.bfloat16)
    args = (table, torch.arange(1, n + 1, device="cuda"), torch.tensor(prefix, device="cuda"),
            torch.tensor(extend, device="cuda"))
    scale = 192 ** -0.5 if kind == "mla" else None
    q_ref = q.to(fp8) if fp8 is not None else q
    ref = extend_naive.extend_attention(q_ref.float(), k_buf.float(), v_buf.float(), *args, sm_scale=scale)
    out = fused("extend_attention").extend_attention(q, k_buf, v_buf, *args, sm_scale=scale)
    assert_close("o", ref, out.float(), 1e-2)


@pytest.mark.gpu
def test_conv1d_prefill_bf16_gpu():
    """Kimi-Linear: q|k|v channels 3 * 32 * 128, width 4, bf16 pool view, mixed lengths and initial states."""
    torch.manual_seed(6)
    lens, dim = [1, 700, 3, 4096], 3 * 32 * 128
    conv = torch.randn(20, 3, dim, device="cuda", dtype=torch.bfloat16)
    ref_conv = conv.clone()
    slots = torch.tensor([4, 9, -1, 2], device="cuda")
    init = torch.tensor([True, False, True, True], device="cuda")
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda")
    x = torch.randn(sum(lens), dim, device="cuda", dtype=torch.bfloat16)
    w, b = torch.randn(dim, 4, device="cuda"), torch.randn(dim, device="cuda")
    ref = conv_naive.conv1d_prefill(x, ref_conv.transpose(-1, -2), w, b, slots, cu, init)
    out = fused("conv1d_prefill").conv1d_prefill(x, conv.transpose(-1, -2), w, b, slots, cu, init)
    assert_close("y", ref.float(), out.float(), 1e-2)
    assert_close("state", ref_conv.float(), conv.float(), 1e-3)
