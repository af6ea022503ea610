"""store_kv / store_mla_kv: new tokens' rows land at ``out_cache_loc``; every other row is bit-identical."""

import pytest
import torch

from kernels.ops.store_kv import naive
from pools import MHATokenToKVPool, MLATokenToKVPool
from tests.kernels.utils import DEVICE, assert_bit_equal, assert_rows_untouched, fused, poison_


def test_naive_hand():
    kb = torch.zeros(4, 1, 2, device=DEVICE)
    vb = torch.zeros(4, 1, 3, device=DEVICE)
    k = torch.tensor([[[1.0, 2.0]], [[3.0, 4.0]]], device=DEVICE)
    v = torch.tensor([[[5.0, 6.0, 7.0]], [[8.0, 9.0, 10.0]]], device=DEVICE)
    naive.store_kv(kb, vb, torch.tensor([3, 1], device=DEVICE), k, v)
    assert kb[:, 0].tolist() == [[0, 0], [3, 4], [0, 0], [1, 2]]
    assert vb[:, 0].tolist() == [[0, 0, 0], [8, 9, 10], [0, 0, 0], [5, 6, 7]]


def _slots(num_tokens, rows, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randperm(rows - 1, generator=g)[:num_tokens] + 1).to(DEVICE)  # distinct, never the pad row 0


@pytest.mark.parametrize("T,H,D,DV,dtype", [
    (1, 1, 16, 16, torch.float32), (7, 3, 24, 40, torch.float16), (33, 2, 128, 128, torch.float16),
    (5, 1, 72, 72, torch.float32),
], ids=["T1-H1-D16-DV16-fp32", "T7-H3-D24-DV40-fp16", "T33-H2-D128-DV128-fp16", "T5-H1-D72-DV72-fp32"])
def test_store_kv(T, H, D, DV, dtype):
    torch.manual_seed(42)
    pool = MHATokenToKVPool(40, 1, {torch.float32: "float32", torch.float16: "float16"}[dtype], H, D, layer_num=2,
                            device=DEVICE, v_head_dim=DV)
    kb, vb = poison_(pool.k_buffer[1]), poison_(pool.v_buffer[1])
    kb0, vb0 = kb.clone(), vb.clone()
    loc = _slots(T, pool.rows, T)
    # k and v as views into one fused projection output, as a model hands them over (token stride > H*D)
    qkv = torch.randn(T, H * (2 * D + DV) + 5, device=DEVICE, dtype=torch.float32)
    k = qkv[:, H * D:2 * H * D].view(T, H, D)
    v = qkv[:, 2 * H * D:2 * H * D + H * DV].view(T, H, DV)
    ref_k, ref_v = kb.clone(), vb.clone()
    naive.store_kv(ref_k, ref_v, loc, k, v)
    fused("store_kv").store_kv(kb, vb, loc, k, v)
    assert_bit_equal("k_buffer", ref_k, kb)
    assert_bit_equal("v_buffer", ref_v, vb)
    assert_bit_equal("k rows", kb[loc], k.to(dtype))
    assert_rows_untouched("k_buffer", kb0, kb, loc.tolist())
    assert_rows_untouched("v_buffer", vb0, vb, loc.tolist())


@pytest.mark.parametrize("split", [False, True], ids=["latent", "nope+rope"])
@pytest.mark.parametrize("T,lora,rope", [(6, 32, 8), (19, 512, 64)], ids=["T6-L32-R8", "T19-L512-R64"])
def test_store_mla_kv(T, lora, rope, split):
    torch.manual_seed(42)
    pool = MLATokenToKVPool(30, 1, "float16", lora, rope, layer_num=1, device=DEVICE)
    buf = poison_(pool.kv_buffer[0])
    buf0 = buf.clone()
    loc = _slots(T, pool.rows, T)
    latent = torch.randn(T, 1, lora + rope, device=DEVICE, dtype=torch.float16)
    args = (latent[..., :lora], latent[..., lora:]) if split else (latent,)
    ref = buf.clone()
    naive.store_mla_kv(ref, loc, *args)
    fused("store_kv").store_mla_kv(buf, loc, *args)
    assert_bit_equal("kv_buffer", ref, buf)
    assert_bit_equal("kv rows", buf[loc], latent)
    assert_rows_untouched("kv_buffer", buf0, buf, loc.tolist())


@pytest.mark.parametrize("impl", ["naive", "fused"])
def test_rejects(impl):
    mod = naive if impl == "naive" else fused("store_kv")
    kb, vb = torch.zeros(4, 2, 8, device=DEVICE), torch.zeros(4, 2, 8, device=DEVICE)
    k = torch.ones(2, 2, 8, device=DEVICE)
    with pytest.raises(IndexError, match="out_cache_loc"):
        mod.store_kv(kb, vb, torch.tensor([1, 4], device=DEVICE), k, k)
    with pytest.raises(ValueError, match="tokens but"):
        mod.store_kv(kb, vb, torch.tensor([1], device=DEVICE), k, k)
    with pytest.raises(ValueError, match="contiguous"):
        mod.store_kv(kb, vb, torch.tensor([1, 2], device=DEVICE), k.transpose(0, 1).contiguous().transpose(0, 1),
                     k.transpose(1, 2).contiguous().transpose(1, 2))
    assert (kb == 0).all() and (vb == 0).all()


@pytest.mark.gpu
def test_store_kv_bf16_gpu():
    torch.manual_seed(42)
    pool = MHATokenToKVPool(5000, 1, "bfloat16", 8, 128, layer_num=1, device="cuda")
    kb, vb = poison_(pool.k_buffer[0]), poison_(pool.v_buffer[0])
    kb0 = kb.clone()
    loc = _slots(1000, pool.rows, 0)
    k = torch.randn(1000, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1000, 8, 128, device="cuda", dtype=torch.bfloat16)
    fused("store_kv").store_kv(kb, vb, loc, k, v)
    assert_bit_equal("k rows", kb[loc], k)
    assert_bit_equal("v rows", vb[loc], v)
    assert_rows_untouched("k_buffer", kb0, kb, loc.tolist())
