"""--ep-size: routed experts split num_experts / ep per rank, each over moe_tp = tp / ep (hand-derived)."""

import pytest

from poolsim.pools.errors import SizingError
from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.plan import plan_memory
from poolsim.pools.sizing.server_args import ServerArgs

H200 = get_gpu("H200")
GIB = 1 << 30


def plan(name, **flags):
    return plan_memory(ModelConfig.load(name), H200, ServerArgs(**flags))


def fp8(out, inp):
    return out * inp + -(-out // 128) * -(-inp // 128) * 4


def test_deepseek_v3_ep8_holds_the_same_expert_bytes_as_tp8():
    """256 experts of intermediate 2048 on 58 MoE layers: 256 at 1/8 width or 32 at full width."""
    tp_bytes = 256 * (fp8(2 * 2048 // 8, 7168) + fp8(7168, 2048 // 8))
    ep_bytes = 32 * (fp8(2 * 2048, 7168) + fp8(7168, 2048))
    assert tp_bytes == ep_bytes
    m = ModelConfig.load("deepseek-v3")
    assert m.weight_bytes_per_rank(8, ep=8) == m.weight_bytes_per_rank(8)
    a, b = plan("deepseek-v3", tp_size=8), plan("deepseek-v3", tp_size=8, ep_size=8)
    assert (b.weights_gib_per_rank, b.max_total_num_tokens) == (a.weights_gib_per_rank, a.max_total_num_tokens)
    assert b.layout.to_dict() == dict(tp=8, attn_tp=8, attn_dp=1, ep=8, pp=1, nnodes=1)


def test_gpt_oss_ep8_stops_replicating_the_down_bias():
    """gpt-oss-120b's w2 bias ([experts, hidden], bf16) is not tp-sharded: every rank holds all 128 experts' at tp
    8, 16 of them at ep 8. The MXFP4 w13/w2 (2880 x 2880 per expert, 4 bits + a scale per 32) split evenly."""
    a, b = plan("gpt-oss-120b", tp_size=8), plan("gpt-oss-120b", tp_size=8, ep_size=8)
    saved = 36 * (128 - 16) * 2880 * 2  # B
    assert round((a.weights_gib_per_rank - b.weights_gib_per_rank) * GIB) == saved == 23_224_320


def test_ep4_inside_tp8_splits_the_intermediate_over_2():
    m = ModelConfig.load("qwen3-30b-a3b")  # 128 experts of intermediate 768, hidden 2048, 48 layers, bf16
    per_expert = lambda width: (2 * 768 // width) * 2048 * 2 + 2048 * (768 // width) * 2  # noqa: E731
    delta = m.weight_bytes_per_rank(8, ep=4) - m.weight_bytes_per_rank(8)
    assert delta == 48 * (32 * per_expert(2) - 128 * per_expert(8)) == 0


@pytest.mark.parametrize("flags, match", [
    (dict(tp_size=8, ep_size=3), "--tp 8 is not divisible by --ep-size 3"),
    (dict(tp_size=12, ep_size=12), "does not divide the 256 routed experts"),
    (dict(tp_size=8, ep_size=8, moe_a2a_backend="deepep"), "--moe-a2a-backend deepep: poolsim sizes only none"),
])
def test_checks(flags, match):
    with pytest.raises(SizingError, match=match):
        plan("deepseek-v3", **flags)
