"""store_kv / store_mla_kv: new tokens' rows land at ``out_cache_loc``; every other row is bit-identical."""

import pytest
import torch

from poolsim.kernels.ops.store_kv import naive
from poolsim.pools import MHATokenToKVPool, MLATokenToKVPool
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
def test_fp8_hand(impl):
    # SGLang (memory_pool.py:2927-2936): a bf16 source is divided by the layer's scale in bf16, cast to fp8 by torch,
    # and its bytes land in the uint8 buffer. e4m3fn bytes (bias 7): 1.0 = 0 0111 000 = 56, -1.5 = 1 0111 100 = 188,
    # 0.5 = 0 0110 000 = 48; 3.3 rounds to 3.25 = 1.625 * 2 = 0 1000 101 = 69.
    mod = naive if impl == "naive" else fused("store_kv")
    kb = torch.zeros(4, 1, 2, dtype=torch.uint8, device=DEVICE)
    vb = torch.zeros(4, 1, 2, dtype=torch.uint8, device=DEVICE)
    k = torch.tensor([[[2.0, -3.0]]], dtype=torch.bfloat16, device=DEVICE)
    v = torch.tensor([[[3.3, 0.5]]], dtype=torch.bfloat16, device=DEVICE)
    mod.store_kv(kb, vb, torch.tensor([2], device=DEVICE), k, v, k_scale=2.0, kv_dtype=torch.float8_e4m3fn)
    assert kb[:, 0].tolist() == [[0, 0], [0, 0], [56, 188], [0, 0]]
    assert vb[:, 0].tolist() == [[0, 0], [0, 0], [69, 48], [0, 0]]
    # e5m2 (bias 15): 1.0 = 0 01111 00 = 60;  MLA latent, no scale
    buf = torch.zeros(3, 1, 2, dtype=torch.uint8, device=DEVICE)
    mod.store_mla_kv(buf, torch.tensor([1], device=DEVICE), torch.tensor([[[1.0]]], device=DEVICE),
                     torch.tensor([[[-1.0]]], device=DEVICE), kv_dtype=torch.float8_e5m2)
    assert buf[:, 0].tolist() == [[0, 0], [60, 188], [0, 0]]  # -1.0 = 1 01111 00 = 188
    with pytest.raises(ValueError, match="kv_dtype"):
        mod.store_kv(kb, vb, torch.tensor([2], device=DEVICE), k, v)


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_store_kv_fp8_pool(kv):
    """An fp8 MHA pool (uint8 buffers) and an fp8 MLA pool: Triton writes the bytes the reference does."""
    torch.manual_seed(7)
    fp8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[kv]
    pool = MHATokenToKVPool(40, 1, kv, 2, 24, layer_num=1, device=DEVICE, v_head_dim=40)
    kb, vb = poison_(pool.k_buffer[0]), poison_(pool.v_buffer[0])
    assert kb.dtype == torch.uint8
    kb0, vb0 = kb.clone(), vb.clone()
    loc = _slots(9, pool.rows, 9)
    k = (torch.randn(9, 2, 24, device=DEVICE) * 50).to(torch.bfloat16)  # beyond e4m3's 448 too
    v = torch.randn(9, 2, 40, device=DEVICE).to(torch.bfloat16)
    ref_k, ref_v = kb.clone(), vb.clone()
    naive.store_kv(ref_k, ref_v, loc, k, v, k_scale=0.5, v_scale=None, kv_dtype=fp8)
    fused("store_kv").store_kv(kb, vb, loc, k, v, k_scale=0.5, v_scale=None, kv_dtype=fp8)
    assert_bit_equal("k_buffer", ref_k, kb)
    assert_bit_equal("v_buffer", ref_v, vb)
    assert_bit_equal("k rows", kb[loc], (k / 0.5).to(fp8).view(torch.uint8))
    assert_rows_untouched("k_buffer", kb0, kb, loc.tolist())
    assert_rows_untouched("v_buffer", vb0, vb, loc.tolist())
    mla = MLATokenToKVPool(30, 1, kv, 32, 8, layer_num=1, device=DEVICE)
    buf = poison_(mla.kv_buffer[0])
    buf0, ref = buf.clone(), buf.clone()
    latent = torch.randn(6, 1, 40, device=DEVICE, dtype=torch.bfloat16)
    loc = _slots(6, mla.rows, 6)
    naive.store_mla_kv(ref, loc, latent[..., :32], latent[..., 32:], kv_dtype=fp8)
    fused("store_kv").store_mla_kv(buf, loc, latent[..., :32], latent[..., 32:], kv_dtype=fp8)
    assert_bit_equal("kv_buffer", ref, buf)
    assert_bit_equal("kv rows", buf[loc], latent.to(fp8).view(torch.uint8))
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
