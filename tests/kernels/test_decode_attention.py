"""decode_attention: MHA/GQA and absorbed MLA over req_to_token-paged KV, split-K against a plain softmax."""

import math

import pytest
import torch
import torch.nn.functional as F

from poolsim.kernels.ops.decode_attention import naive
from poolsim.pools import MHATokenToKVPool, MLATokenToKVPool, ReqToTokenPool
from tests.kernels.utils import DEVICE, assert_close, fused, poison_, randn

_POOL_DTYPE = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def test_naive_hand():
    # one head, q = [1, 0], keys [1, 0] and [0, 1], scale 1: scores [1, 0],
    # p = [e/(e+1), 1/(e+1)] = [0.7310586, 0.2689414]; values [1, 2], [3, 4]:
    # o = [0.7310586 + 3 * 0.2689414, 2 * 0.7310586 + 4 * 0.2689414] = [1.5378828, 2.5378828]
    kb = torch.tensor([[[9.0, 9.0]], [[1.0, 0.0]], [[0.0, 1.0]]], device=DEVICE)
    vb = torch.tensor([[[9.0, 9.0]], [[1.0, 2.0]], [[3.0, 4.0]]], device=DEVICE)
    table = torch.tensor([[0, 0, 0], [1, 2, 0]], dtype=torch.int32, device=DEVICE)
    q = torch.tensor([[[1.0, 0.0]]], device=DEVICE)
    o = naive.decode_attention(q, kb, vb, table, torch.tensor([1], device=DEVICE), torch.tensor([2], device=DEVICE),
                               sm_scale=1.0)
    torch.testing.assert_close(o[0, 0], torch.tensor([1.5378828, 2.5378828], device=DEVICE), rtol=1e-6, atol=1e-6)


def _paged_batch(seq_lens, rows, max_ctx, seed):
    """A req_to_token table with -1 past each seq_len and distinct KV slots (never the pad slot 0)."""
    g = torch.Generator().manual_seed(seed)
    pool = ReqToTokenPool(len(seq_lens) + 2, max_ctx, device=DEVICE)
    table = poison_(pool.req_to_token)
    req_rows = torch.randperm(len(seq_lens) + 2, generator=g)[:len(seq_lens)] + 1
    slots = torch.randperm(rows - 1, generator=g) + 1
    used = 0
    for row, n in zip(req_rows.tolist(), seq_lens):
        table[row, :n] = slots[used:used + n].to(torch.int32).to(DEVICE)
        used += n
    assert used <= rows - 1
    return table, req_rows.to(DEVICE), torch.tensor(seq_lens, device=DEVICE), slots[:used]


def test_naive_matches_sdpa():
    torch.manual_seed(42)
    seq_lens = [5, 17, 1]
    kb, vb = randn(40, 2, 16), randn(40, 2, 8)
    table, rows, lens, _ = _paged_batch(seq_lens, 40, 20, 0)
    q = randn(3, 6, 16)
    o = naive.decode_attention(q, kb, vb, table, rows, lens)
    for i, n in enumerate(seq_lens):
        slots = table[rows[i], :n].long()
        k = kb[slots].repeat_interleave(3, 1).transpose(0, 1)  # [Hq, L, D]
        v = vb[slots].repeat_interleave(3, 1).transpose(0, 1)
        ref = F.scaled_dot_product_attention(q[i][:, None], k, v)[:, 0]
        assert_close(f"req {i}", ref, o[i], 1e-6)


CASES = [
    # name, Hq, Hkv, DK, DV, seq_lens, splits
    ("MHA", 3, 3, 24, 24, [1, 37, 0, 64], 2),
    ("GQA-tail", 8, 2, 40, 32, [100, 5], 4),
    ("GQA-one-split", 4, 1, 16, 16, [33, 2, 17], 1),
    ("many-splits", 2, 1, 32, 48, [3, 20], 8),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-N{len(c[5])}-Hq{c[1]}-Hkv{c[2]}-DK{c[3]}-DV{c[4]}-S{c[6]}"
                                             for c in CASES])
def test_decode_attention(case, dtype):
    _, hq, hkv, dk, dv, seq_lens, splits = case
    torch.manual_seed(42)
    pool = MHATokenToKVPool(sum(seq_lens) + 9, 1, _POOL_DTYPE[dtype], hkv, dk, layer_num=1, device=DEVICE,
                            v_head_dim=dv)
    kb, vb = poison_(pool.k_buffer[0]), poison_(pool.v_buffer[0])  # rows no request uses stay NaN
    table, rows, lens, slots = _paged_batch(seq_lens, pool.rows, 128, len(seq_lens))
    kb[slots] = randn(len(slots), hkv, dk, dtype=dtype)
    vb[slots] = randn(len(slots), hkv, dv, dtype=dtype)
    q = randn(len(seq_lens), hq, dk, dtype=dtype)
    ref = naive.decode_attention(q, kb, vb, table, rows, lens)
    out = fused("decode_attention").decode_attention(q, kb, vb, table, rows, lens, num_kv_splits=splits)
    assert_close("o", ref.float(), out.float(), 1e-5 if dtype == torch.float32 else 2e-3)
    empty = [i for i, n in enumerate(seq_lens) if n == 0]
    assert (out[empty] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("H,lora,rope,seq_lens", [(5, 32, 8, [9, 70]), (16, 64, 16, [1, 30, 3])],
                         ids=["H5-L32-R8", "H16-L64-R16"])
def test_decode_attention_mla(H, lora, rope, seq_lens, dtype):
    """Absorbed MLA: K is the whole latent row, V its first kv_lora_rank columns (read once)."""
    torch.manual_seed(42)
    pool = MLATokenToKVPool(sum(seq_lens) + 5, 1, _POOL_DTYPE[dtype], lora, rope, layer_num=1, device=DEVICE)
    buf = poison_(pool.kv_buffer[0])
    table, rows, lens, slots = _paged_batch(seq_lens, pool.rows, 80, 3)
    buf[slots] = randn(len(slots), 1, lora + rope, dtype=dtype)
    q = randn(len(seq_lens), H, lora + rope, dtype=dtype)
    scale = 1 / math.sqrt(24)  # (qk_nope + qk_rope)^-1/2, not the latent width
    ref = naive.decode_attention(q, buf, buf[..., :lora], table, rows, lens, sm_scale=scale)
    out = fused("decode_attention").decode_attention(q, buf, buf[..., :lora], table, rows, lens, sm_scale=scale,
                                                     num_kv_splits=3)
    assert_close("o", ref.float(), out.float(), 1e-5 if dtype == torch.float32 else 2e-3)


@pytest.mark.parametrize("impl", ["naive", "fused"])
def test_rejects_out_of_range_slots(impl):
    mod = naive if impl == "naive" else fused("decode_attention")
    kb = torch.zeros(8, 1, 16, device=DEVICE)
    table = torch.tensor([[1, 2, 8, -1]], dtype=torch.int32, device=DEVICE)
    q = torch.zeros(1, 1, 16, device=DEVICE)
    with pytest.raises(IndexError, match="req_to_token entry"):
        mod.decode_attention(q, kb, kb, table, torch.tensor([0], device=DEVICE), torch.tensor([3], device=DEVICE))
    with pytest.raises(ValueError, match="exceeds the row length"):
        mod.decode_attention(q, kb, kb, table, torch.tensor([0], device=DEVICE), torch.tensor([5], device=DEVICE))
    out = mod.decode_attention(q, kb, kb, table, torch.tensor([0], device=DEVICE), torch.tensor([2], device=DEVICE))
    assert out.shape == (1, 1, 16)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["gqa", "mla"])
def test_decode_attention_bf16_gpu(kind):
    torch.manual_seed(42)
    seq_lens = [1, 700, 4096, 33]
    if kind == "gqa":  # Llama-70B tp8: 8 q heads on 1 KV head of 128
        pool = MHATokenToKVPool(sum(seq_lens) + 1, 1, "bfloat16", 1, 128, layer_num=1, device="cuda")
        kb, vb, hq, scale = pool.k_buffer[0], pool.v_buffer[0], 8, None
    else:  # Kimi-Linear MLA: 32 heads, latent 512 + rope 64
        pool = MLATokenToKVPool(sum(seq_lens) + 1, 1, "bfloat16", 512, 64, layer_num=1, device="cuda")
        kb, hq, scale = pool.kv_buffer[0], 32, 192 ** -0.5
        vb = kb[..., :512]
    kb.copy_(torch.randn_like(kb))
    if kind == "gqa":
        vb.copy_(torch.randn_like(vb))
    table, rows, lens, _ = _paged_batch(seq_lens, pool.rows, 4096, 1)
    q = torch.randn(len(seq_lens), hq, kb.shape[-1], device="cuda", dtype=torch.bfloat16)
    ref = naive.decode_attention(q.float(), kb.float(), vb.float(), table, rows, lens, sm_scale=scale)
    out = fused("decode_attention").decode_attention(q, kb, vb, table, rows, lens, sm_scale=scale)
    assert_close("o", ref, out.float(), 1e-2)


def test_fp32_q_over_a_half_cache_is_cast_to_the_cache_dtype():
    """An fp32 q with an fp16 KV cache (fp16: bf16's role on the CPU interpreter) runs as SGLang's: q cast to the
    cache dtype, o back in q's dtype; it equals the reference on the cast q."""
    from poolsim.kernels.ops.decode_attention import naive

    torch.manual_seed(3)
    kb = torch.randn(12, 2, 16, device=DEVICE).half()
    vb = torch.randn(12, 2, 16, device=DEVICE).half()
    table = torch.arange(12, dtype=torch.int32, device=DEVICE).reshape(2, 6)
    q = torch.randn(2, 4, 16, device=DEVICE)
    rows, lens = torch.tensor([0, 1], device=DEVICE), torch.tensor([5, 6], device=DEVICE)
    out = fused("decode_attention").decode_attention(q, kb, vb, table, rows, lens)
    assert out.dtype == torch.float32
    ref = naive.decode_attention(q.half(), kb, vb, table, rows, lens)
    assert_close("o", ref.float(), out, 2e-3)


@pytest.mark.parametrize("impl", ["naive", "fused"])
def test_fp8_hand(impl):
    # fp8_e4m3 cache in uint8 buffers (SGLang's store_dtype). Keys [1, 0], [0, 1], values [1, 2], [3, 4] (exact in
    # fp8), k_scale 2 (folded into sm_scale = 1), v_scale 0.5 (on the output).
    # Two q heads on one KV head (SGLang's grouped kernel): q = [1.1, 0] is rounded to fp8 first, 1.125; scores
    # [2.25, 0], p0 = sigmoid(2.25) = 0.9046505; o = 0.5 * (p0 [1, 2] + (1 - p0) [3, 4]) = [0.5953495, 1.0953495].
    # One q head (the MHA kernel, q not rounded): scores [2.2, 0], p0 = 0.9002495, o = [0.5997505, 1.0997505].
    mod = naive if impl == "naive" else fused("decode_attention")
    fp8 = torch.float8_e4m3fn
    kb = torch.tensor([[[0.0, 0.0]], [[1.0, 0.0]], [[0.0, 1.0]]], device=DEVICE).to(fp8).view(torch.uint8)
    vb = torch.tensor([[[0.0, 0.0]], [[1.0, 2.0]], [[3.0, 4.0]]], device=DEVICE).to(fp8).view(torch.uint8)
    table = torch.tensor([[0, 0, 0], [1, 2, 0]], dtype=torch.int32, device=DEVICE)
    args = (table, torch.tensor([1], device=DEVICE), torch.tensor([2], device=DEVICE))
    kw = dict(sm_scale=1.0, k_scale=2.0, v_scale=0.5, kv_dtype=fp8)
    o = mod.decode_attention(torch.tensor([[[1.1, 0.0], [1.1, 0.0]]], device=DEVICE), kb, vb, *args, **kw)
    want = torch.tensor([[0.5953495, 1.0953495]] * 2, device=DEVICE)
    torch.testing.assert_close(o[0], want, rtol=1e-6, atol=1e-6)
    o = mod.decode_attention(torch.tensor([[[1.1, 0.0]]], device=DEVICE), kb, vb, *args, **kw)
    torch.testing.assert_close(o[0, 0], torch.tensor([0.5997505, 1.0997505], device=DEVICE), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="kv_dtype"):
        mod.decode_attention(torch.zeros(1, 1, 2, device=DEVICE), kb, vb, *args)


FP8_CASES = [  # name, Hq, Hkv, DK, DV, seq_lens, splits, fp8 dtype
    ("MHA-e4m3", 2, 2, 24, 24, [1, 37, 0], 2, torch.float8_e4m3fn),
    ("GQA-e4m3", 8, 2, 40, 32, [50, 5], 3, torch.float8_e4m3fn),
    ("GQA-e5m2", 4, 1, 16, 16, [33, 2], 1, torch.float8_e5m2),
]


@pytest.mark.parametrize("case", FP8_CASES, ids=[c[0] for c in FP8_CASES])
def test_decode_attention_fp8_pool(case):
    """An fp8 MHA pool (uint8 buffers): Triton equals the reference, and the reference equals plain attention over
    the dequantized cache (times the scales) with q rounded to fp8 where heads are grouped."""
    _, hq, hkv, dk, dv, seq_lens, splits, fp8 = case
    torch.manual_seed(11)
    name = {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}[fp8]
    pool = MHATokenToKVPool(sum(seq_lens) + 9, 1, name, hkv, dk, layer_num=1, device=DEVICE, v_head_dim=dv)
    kb, vb = pool.k_buffer[0], pool.v_buffer[0]
    table, rows, lens, slots = _paged_batch(seq_lens, pool.rows, 64, 5)
    kb[slots] = randn(len(slots), hkv, dk).to(fp8).view(torch.uint8)
    vb[slots] = randn(len(slots), hkv, dv).to(fp8).view(torch.uint8)
    q = randn(len(seq_lens), hq, dk, dtype=torch.float16)
    kw = dict(k_scale=0.7, v_scale=1.5, kv_dtype=fp8)
    ref = naive.decode_attention(q, kb, vb, table, rows, lens, **kw)
    out = fused("decode_attention").decode_attention(q, kb, vb, table, rows, lens, num_kv_splits=splits, **kw)
    assert out.dtype == torch.float16
    assert_close("o", ref.float(), out.float(), 2e-3)  # fp16 output rounding
    q_used = q.to(fp8).float() if hq > hkv else q.float()
    plain = naive.decode_attention(q_used, kb.view(fp8).float() * 0.7, vb.view(fp8).float(), table, rows, lens,
                                   sm_scale=dk ** -0.5) * 1.5
    assert_close("dequantized", plain, ref.float(), 2e-3)


def test_decode_attention_fp8_mla():
    """fp8 MLA latent cache: K the whole row, V its first kv_lora_rank columns of the same bytes."""
    torch.manual_seed(12)
    lora, rope, seq_lens = 32, 16, [9, 40]
    fp8 = torch.float8_e4m3fn
    pool = MLATokenToKVPool(sum(seq_lens) + 5, 1, "fp8_e4m3", lora, rope, layer_num=1, device=DEVICE)
    buf = pool.kv_buffer[0]
    table, rows, lens, slots = _paged_batch(seq_lens, pool.rows, 64, 3)
    buf[slots] = randn(len(slots), 1, lora + rope).to(fp8).view(torch.uint8)
    q = randn(len(seq_lens), 4, lora + rope)
    scale = 24 ** -0.5
    ref = naive.decode_attention(q, buf, buf[..., :lora], table, rows, lens, sm_scale=scale, kv_dtype=fp8)
    out = fused("decode_attention").decode_attention(q, buf, buf[..., :lora], table, rows, lens, sm_scale=scale,
                                                     num_kv_splits=2, kv_dtype=fp8)
    assert_close("o", ref, out, 1e-5)
    deq = buf.view(fp8).float()
    plain = naive.decode_attention(q.to(fp8).float(), deq, deq[..., :lora], table, rows, lens, sm_scale=scale)
    assert_close("dequantized", plain, ref, 1e-6)


@pytest.mark.gpu
def test_decode_attention_fp8_gpu():
    """Llama-3.1-8B with --kv-cache-dtype fp8_e4m3: 32 q heads on 8 KV heads of 128, uint8 pool, long contexts."""
    torch.manual_seed(43)
    seq_lens, fp8 = [1, 700, 4096, 33], torch.float8_e4m3fn
    pool = MHATokenToKVPool(sum(seq_lens) + 1, 1, "fp8_e4m3", 8, 128, layer_num=1, device="cuda")
    kb, vb = pool.k_buffer[0], pool.v_buffer[0]
    kb.copy_(torch.randn(kb.shape, device="cuda").to(fp8).view(torch.uint8))
    vb.copy_(torch.randn(vb.shape, device="cuda").to(fp8).view(torch.uint8))
    table, rows, lens, _ = _paged_batch(seq_lens, pool.rows, 4096, 1)
    q = torch.randn(len(seq_lens), 32, 128, device="cuda", dtype=torch.bfloat16)
    ref = naive.decode_attention(q.float(), kb, vb, table, rows, lens, k_scale=0.5, v_scale=2.0, kv_dtype=fp8)
    out = fused("decode_attention").decode_attention(q, kb, vb, table, rows, lens, k_scale=0.5, v_scale=2.0,
                                                     kv_dtype=fp8)
    assert_close("o", ref, out.float(), 1e-2)
