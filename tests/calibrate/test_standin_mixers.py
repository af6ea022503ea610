"""Stand-in pieces checked by hand: LFM2's short conv, Qwen3-Next's attention output gate and shared-expert gate,
the sigmoid grouped router (Nemotron-H, DeepSeek-V3, Kimi), and the per-rank shapes they are built with."""

import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")

from poolsim.kernels.standin import Dims, StandInForward, StepInputs, biased_grouped_topk, expert_groups  # noqa: E402
from poolsim.pools.model.config import ModelConfig  # noqa: E402

t = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731


def test_biased_grouped_topk_by_hand():
    # 8 experts in 4 groups of 2. logit[6] = ln 3 -> sigmoid 0.75, the rest 0 -> 0.5; choice = score + bias:
    # [.5, .6, .8, .7, .95, 0, 1.15, .3]; group sums of the two best: g0 1.1, g1 1.5, g2 .95, g3 1.45 -> keep g1, g3
    # (expert 4, the second best alone, is in a dropped group) -> experts 6 and 2; unbiased scores .75, .5
    logits = torch.zeros(2, 8)
    logits[:, 6] = math.log(3)
    bias = torch.tensor([0.0, 0.1, 0.3, 0.2, 0.45, -0.5, 0.4, -0.2])
    w, ids = biased_grouped_topk(logits[:1], bias, top_k=2, groups=4, topk_groups=2, renormalize=True, scaling=2.5)
    assert ids.tolist() == [[6, 2]]
    assert torch.allclose(w, torch.tensor([[0.6 * 2.5, 0.4 * 2.5]]))  # .75/1.25, .5/1.25, times 2.5
    w, ids = biased_grouped_topk(logits[1:], bias, top_k=2, groups=4, topk_groups=2, renormalize=False)
    assert ids.tolist() == [[6, 2]] and torch.allclose(w, torch.tensor([[0.75, 0.5]]))
    w, ids = biased_grouped_topk(logits[1:], bias, top_k=2, groups=1, topk_groups=1, renormalize=False)
    assert ids.tolist() == [[6, 4]]  # one group (Nemotron-H's n_group 1): plain top-k of score + bias


def test_router_groups_and_per_rank_shapes():
    assert expert_groups(ModelConfig.load("deepseek-v3")) == (8, 4)  # n_group 8, topk_group 4
    assert expert_groups(ModelConfig.load("nemotron-3-nano-30b-a3b")) == (1, 1)  # n_group 1, topk_group 1
    assert expert_groups(ModelConfig.load("kimi-linear-48b-a3b")) == (1, 1)  # num_expert_group 1
    assert expert_groups(ModelConfig.load("qwen3-next-80b-a3b")) == (1, 1)  # softmax router: no groups
    tiny = Dims.tiny(ModelConfig.load("deepseek-v3"))
    assert (tiny.experts, tiny.expert_groups, tiny.topk_groups) == (8, 4, 4)  # at most 4 groups of 2
    lfm2 = ModelConfig.load("lfm2-700m")  # hidden 1536, conv_L_cache 3: conv weight [1536 / tp, 3]
    for tp, width in ((1, 1536), (2, 768)):
        d = Dims.of(lfm2, tp)
        assert (d.lin_heads, d.lin_head_dim, d.conv_kernel) == (1, width, 3)
        assert d.state_shape("short_conv").conv == lfm2.linear_attn.state_shape(tp).conv == [(width, 2)]


def test_lfm2_short_conv_by_hand():
    """Decode through the short conv: y = out_proj(C * conv(B * x)), conv without activation over the window
    [state, B*x]; the state then holds the last two inputs. Prefill of 3 tokens from a zero state gives the causal
    conv of the same inputs."""
    model = ModelConfig.load("lfm2-700m")
    dims = Dims.tiny(model)
    conv = torch.randn(3, dims.lin_head_dim, 2)  # the pool's conv[0][layer]: [slots, dim, K-1]

    class Pool:
        pass

    pool = Pool()
    pool.conv = [[conv]]
    fwd = StandInForward(model, dims, [0], "cpu", torch.float32, seed=1, mamba_pool=pool)
    w = fwd.layers[0]
    h = torch.randn(2, dims.hidden)
    before = conv.clone()
    dec = StepInputs(t([]), t([]), t([]), t([]), t([1, 2]), t([5, 5]), t([0, 0]), None, t([2, 0]))
    got = fwd._short_conv(h, w, dec, 0)
    b, c, x = (h @ w["in_proj"]).chunk(3, dim=-1)
    bx, cw = b * x, w["conv"]  # cw [dim, 3]
    for row, slot in enumerate([2, 0]):
        y = before[slot][:, 0] * cw[:, 0] + before[slot][:, 1] * cw[:, 1] + bx[row] * cw[:, 2]
        assert torch.allclose(got[row], (c[row] * y) @ w["wo"], atol=1e-5)
        assert torch.equal(conv[slot][:, 0], before[slot][:, 1]) and torch.allclose(conv[slot][:, 1], bx[row])
    assert torch.equal(conv[1], before[1])
    hp = torch.randn(3, dims.hidden)
    pre = StepInputs(t([1]), t([0]), t([3]), t([0, 0, 0]), t([]), t([]), t([]), t([1]), None)
    got = fwd._short_conv(hp, w, pre, 0)
    b, c, x = (hp @ w["in_proj"]).chunk(3, dim=-1)
    bx = torch.cat([torch.zeros(2, dims.lin_head_dim), b * x])  # no initial state: zeros before the first token
    for i in range(3):
        y = bx[i] * cw[:, 0] + bx[i + 1] * cw[:, 1] + bx[i + 2] * cw[:, 2]
        assert torch.allclose(got[i], (c[i] * y) @ w["wo"], atol=1e-5)
    assert torch.allclose(conv[1], bx[3:].T)


def _attn_forward(model, seed=2):
    from poolsim.pools.mem_cache.pool.mha import MHATokenToKVPool

    dims = Dims.tiny(model)
    layer = next(i for i, spec in enumerate(model.layers) if spec.mixer == "attention")
    kv = MHATokenToKVPool(50, 1, "float32", dims.kv_heads, dims.head_dim, 1, device="cpu")
    table = torch.zeros(2, 8, dtype=torch.int32)
    table[1, :3] = t([4, 5, 6])
    return StandInForward(model, dims, [layer], "cpu", torch.float32, seed=seed, kv_pool=kv, req_to_token=table), \
        dims, layer


def test_qwen3_next_attention_output_gate():
    """Qwen3-Next packs [q | gate] per head in the QKV projection and multiplies the attention output by
    sigmoid(gate): with the gate columns zeroed the output is half the ungated layer's with the same q, k, v."""
    model = ModelConfig.load("qwen3-next-80b-a3b")
    gated, dims, layer = _attn_forward(model)
    plain, _, _ = _attn_forward(dataclasses.replace(model, attn_output_gate=False))
    hd, heads = dims.head_dim, dims.heads
    wg, wp = gated.layers[layer], plain.layers[layer]
    assert wg["wqkv"].shape[1] == (2 * heads + dims.kv_heads) * hd + dims.kv_heads * dims.v_head_dim
    q_cols = torch.cat([torch.arange(2 * i * hd, (2 * i + 1) * hd) for i in range(heads)])
    gate_cols = q_cols + hd
    wg["wqkv"][:, gate_cols] = 0
    wp["wqkv"] = torch.cat([wg["wqkv"][:, q_cols], wg["wqkv"][:, 2 * heads * hd:]], dim=1)
    wp["wo"], wp["q_norm"], wp["k_norm"] = wg["wo"], wg["q_norm"], wg["k_norm"]
    h = torch.randn(3, dims.hidden)
    pre = StepInputs(t([1]), t([0]), t([3]), t([4, 5, 6]), t([]), t([]), t([]), None, None)
    assert torch.allclose(gated._mha(h, wg, pre, layer), 0.5 * plain._mha(h, wp, pre, layer), atol=1e-6)


def test_qwen3_next_shared_expert_gate():
    """The shared expert's output is scaled by sigmoid(h @ shared_expert_gate): a zero gate halves it."""
    model = ModelConfig.load("qwen3-next-80b-a3b")
    fwd, dims, layer = _attn_forward(model)
    w = dict(fwd.layers[layer])
    assert w["s_gate"].shape == (dims.hidden, 1) and dims.shared_inter > 0
    h = torch.randn(5, dims.hidden)
    w["s_gate"] = torch.zeros(dims.hidden, 1)
    half = fwd._moe(h, w)
    routed = fwd._moe(h, {k: v for k, v in w.items() if k not in ("s_gu", "s_d", "s_gate")})
    full = fwd._moe(h, {k: v for k, v in w.items() if k != "s_gate"})
    assert torch.allclose(half, routed + 0.5 * (full - routed), atol=1e-5)
