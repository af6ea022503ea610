"""conv1d_update: the causal depthwise conv window over pool slots (SGLang's transposed conv view)."""

import math

import pytest
import torch

from poolsim.kernels.ops.conv1d_update import naive
from poolsim.pools import MambaCacheParams, MambaPool, MambaStateShape
from tests.kernels.utils import DEVICE, assert_close, assert_rows_untouched, fused, poison_, randn


def test_naive_hand():
    # one channel, width 4: state [1, 2, 3], token 4, weight [0.1, 0.2, 0.3, 0.4], bias 0.5
    #   y = 0.1 + 0.4 + 0.9 + 1.6 + 0.5 = 3.5;  silu(3.5) = 3.5 / (1 + e^-3.5) = 3.3974104
    #   state <- [2, 3, 4]
    for activation, expected in ((None, 3.5), ("silu", 3.5 / (1 + math.exp(-3.5)))):
        state = torch.tensor([[[9.0, 9.0, 9.0]], [[1.0, 2.0, 3.0]]], device=DEVICE)
        y = naive.conv1d_update(torch.tensor([[4.0]], device=DEVICE), state,
                                torch.tensor([[0.1, 0.2, 0.3, 0.4]], device=DEVICE), torch.tensor([0.5], device=DEVICE),
                                torch.tensor([1], device=DEVICE), activation)
        assert abs(y.item() - expected) < 1e-6
        assert state.tolist() == [[[9.0, 9.0, 9.0]], [[2.0, 3.0, 4.0]]]


@pytest.mark.parametrize("impl", ["naive", "fused"])
def test_padding_row_is_skipped(impl):
    # SGLang 0.5.23's causal_conv1d_update returns before touching a pad_slot_id row
    # (mamba/causal_conv1d_triton.py:693-696): its state is not read or written, its output row is left as
    # torch.empty made it; ours is zeros (a zero window with bias 0.5 would give 0.4 * 4 + 0.5 = 2.1, not 0).
    # The live row beside it: state [1, 2, 3], token 4, weight [0.1 .. 0.4], bias 0.5 -> 3.5.
    mod = naive if impl == "naive" else fused("conv1d_update")
    state = torch.tensor([[[9.0, 9.0, 9.0]], [[1.0, 2.0, 3.0]]], device=DEVICE)
    y = mod.conv1d_update(torch.tensor([[4.0], [4.0]], device=DEVICE), state,
                          torch.tensor([[0.1, 0.2, 0.3, 0.4]], device=DEVICE), torch.tensor([0.5], device=DEVICE),
                          torch.tensor([-1, 1], device=DEVICE), None)
    assert abs(y[1].item() - 3.5) < 1e-6 and y[0].item() == 0.0
    assert state.tolist() == [[[9.0, 9.0, 9.0]], [[2.0, 3.0, 4.0]]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("N,H,D", [(1, 1, 16), (4, 3, 7), (3, 2, 100)], ids=["N1-H1-D16", "N4-H3-D7", "N3-H2-D100"])
def test_conv1d_update_on_mamba_pool(N, H, D, dtype):
    """The pool's conv tensor ``[layers, size+1, W-1, channels]`` seen as ``[slots, channels, W-1]``."""
    torch.manual_seed(42)
    store = {torch.float32: "float32", torch.float16: "float16"}[dtype]
    params = MambaCacheParams(MambaStateShape.kimi_linear(tp=1, num_heads=H, head_dim=D), layers=[0, 1],
                              conv_dtype=store)
    pool = MambaPool(N + 4, params, device=DEVICE)
    conv = poison_(pool.conv[0])
    dim = 3 * H * D
    slots = (torch.randperm(N + 4)[:N] + 1).to(DEVICE)
    if N > 2:
        slots[2] = -1
    live = slots[slots >= 0]
    conv[1, live] = randn(len(live), 3, dim, dtype=dtype)
    before = conv.clone()
    ref_conv = conv.clone()
    x = randn(N, dim, dtype=dtype)
    weight, bias = randn(dim, 4), randn(dim)
    ref = naive.conv1d_update(x, ref_conv[1].transpose(-1, -2), weight, bias, slots)
    out = fused("conv1d_update").conv1d_update(x, conv[1].transpose(-1, -2), weight, bias, slots)
    assert_close("y", ref.float(), out.float(), 1e-6 if dtype == torch.float32 else 1e-3)
    assert (out[slots < 0] == 0).all()
    assert_close("state", ref_conv[1, live].float(), conv[1, live].float(), 1e-6)
    assert torch.equal(conv[1, live, :2], before[1, live, 1:])  # the window shifted by one
    assert_rows_untouched("layer 1", before[1], conv[1], live.tolist())
    assert_rows_untouched("layer 0", before[0], conv[0], [])


@pytest.mark.parametrize("W,bias,activation", [(2, False, None), (3, True, "silu"), (5, False, "swish")],
                         ids=["W2-nobias-linear", "W3-bias-silu", "W5-nobias-swish"])
def test_conv1d_update_widths(W, bias, activation):
    torch.manual_seed(42)
    N, dim = 3, 37
    state = poison_(torch.empty(6, dim, W - 1, device=DEVICE))  # contiguous along width this time
    slots = torch.tensor([5, 1, 3], device=DEVICE)
    state[slots] = randn(N, dim, W - 1)
    before, ref_state = state.clone(), state.clone()
    x, weight = randn(N, dim), randn(dim, W)
    b = randn(dim) if bias else None
    ref = naive.conv1d_update(x, ref_state, weight, b, slots, activation)
    out = fused("conv1d_update").conv1d_update(x, state, weight, b, slots, activation)
    assert_close("y", ref, out, 1e-6)
    assert_close("state", ref_state[slots], state[slots], 1e-7)
    assert_rows_untouched("state", before, state, slots.tolist())


@pytest.mark.parametrize("impl", ["naive", "fused"])
def test_rejects(impl):
    mod = naive if impl == "naive" else fused("conv1d_update")
    state = torch.zeros(3, 8, 3, device=DEVICE)
    x, w = torch.ones(2, 8, device=DEVICE), torch.ones(8, 4, device=DEVICE)
    with pytest.raises(IndexError, match="slot_indices"):
        mod.conv1d_update(x, state, w, None, torch.tensor([0, 3], device=DEVICE))
    with pytest.raises(ValueError, match="conv_state must be"):
        mod.conv1d_update(x, state[..., :2], w, None, torch.tensor([0, 1], device=DEVICE))
    assert (state == 0).all()


@pytest.mark.gpu
def test_conv1d_update_bf16_gpu():
    """Kimi-Linear: q|k|v channels 3 * 32 * 128, width 4, bf16 pool."""
    N, dim = 64, 3 * 32 * 128
    conv = torch.randn(200, 3, dim, device="cuda", dtype=torch.bfloat16)
    ref_conv = conv.clone()
    slots = torch.randperm(199, device="cuda")[:N] + 1
    x = torch.randn(N, dim, device="cuda", dtype=torch.bfloat16)
    w, b = torch.randn(dim, 4, device="cuda"), torch.randn(dim, device="cuda")
    ref = naive.conv1d_update(x, ref_conv.transpose(-1, -2), w, b, slots)
    out = fused("conv1d_update").conv1d_update(x, conv.transpose(-1, -2), w, b, slots)
    assert_close("y", ref.float(), out.float(), 1e-2)
    assert_close("state", ref_conv.float(), conv.float(), 1e-3)
