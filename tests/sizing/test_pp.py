"""--pp-size: layers split across stages by SGLang's get_pp_indices; each stage's weights and pool (by hand)."""

import pytest

from poolsim.pools.errors import SizingError
from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.parallel import pp_layer_ranges
from poolsim.pools.sizing.plan import plan_memory
from poolsim.pools.sizing.server_args import ServerArgs

H200 = get_gpu("H200")
GIB = 1 << 30


def plan(name, **flags):
    return plan_memory(ModelConfig.load(name), H200, ServerArgs(**flags))


def test_get_pp_indices():
    """base = n // pp layers each; the last n % pp stages get one more (distributed/utils.py:137-148)."""
    assert pp_layer_ranges(61, 4) == [(0, 15), (15, 30), (30, 45), (45, 61)]
    assert pp_layer_ranges(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert pp_layer_ranges(36, 2) == [(0, 18), (18, 36)]


def qwen3_8b_layer_bytes():
    """One Qwen3-8B decoder layer, bf16: q/k/v/o, q/k norms, gate_up/down (intermediate 12288), two norms."""
    attn = 4096 * 4096 + 2 * 1024 * 4096 + 4096 * 4096 + 2 * 128
    mlp = 2 * 12288 * 4096 + 4096 * 12288
    return 2 * (attn + mlp + 2 * 4096)


def test_qwen3_8b_pp2_each_stage_its_half_and_the_last_binds():
    p = plan("qwen3-8b", tp_size=1, pp_size=2, mem_fraction_static=0.85)
    embed = 151936 * 4096 * 2
    stage0 = 18 * qwen3_8b_layer_bytes() + embed  # + the embedding
    stage1 = 18 * qwen3_8b_layer_bytes() + embed + 4096 * 2  # + the LM head and the final norm
    (_, a0, b0, w0, t0), (_, a1, b1, w1, t1) = p.pp_stages
    assert (a0, b0, a1, b1) == (0, 18, 18, 36)
    assert (round(w0 * GIB), round(w1 * GIB)) == (stage0, stage1)
    cell = 8 * 128 * 2 * 2 * 18  # 8 KV heads of 128, K and V, bf16, 18 layers per stage
    assert p.cell_size_bytes == cell == 73_728 and p.kv_layer_num == 18
    pre = p.pre_model_load_gib
    for w, t in ((w0, t0), (w1, t1)):
        assert t == int((pre - w - pre * (1 - 0.85)) * GIB) // cell
    # 8 KiB more on stage 1 is less than a 73,728-B token here: equal pools, the first of equals binds
    assert t0 == t1 == p.max_total_num_tokens and p.pp_binding_stage == 0
    assert p.full_attention_layer_ids == tuple(range(0, 18))  # the binding stage's, by global id
    assert p.disable_overlap_schedule  # overrides.py:1624-1628
    assert p.layout.to_dict() == dict(tp=1, attn_tp=1, attn_dp=1, ep=1, pp=2, nnodes=1)


def test_pp_mem_fraction_counts_tp_times_pp():
    """reserved += tp * pp / 8 GiB (memory_hook.py:312): deepseek-v3 tp 8 pp 2 reserves 1 GiB more than pp 1."""
    a, b = plan("deepseek-v3", tp_size=8), plan("deepseek-v3", tp_size=8, pp_size=2)
    mib = H200.memory_mib
    reserved = 512 + 8192 * 1.5 + 8 * 2 / 8 * 1024 + 512 * 2 + 1536
    assert b.mem_fraction_static == round((mib - reserved) / mib, 3) != a.mem_fraction_static


def test_deepseek_v3_stages_add_up_to_the_whole_model():
    m = ModelConfig.load("deepseek-v3")
    p = plan("deepseek-v3", tp_size=8, pp_size=2)
    assert [(a, b) for _, a, b, _, _ in p.pp_stages] == [(0, 30), (30, 61)]
    assert round(sum(w for *_, w, _ in p.pp_stages) * GIB) == m.weight_bytes_per_rank(8)
    assert p.cell_size_bytes == (512 + 64) * 2 * 31 and p.pp_binding_stage == 1


@pytest.mark.parametrize("name, flags, match", [
    ("qwen3-next-80b-a3b", dict(tp_size=4, pp_size=2), "does not split hybrid linear attention"),
    ("qwen3-8b", dict(pp_size=40), "more stages than the model's 36 layers"),
])
def test_refusals(name, flags, match):
    with pytest.raises(SizingError, match=match):
        plan(name, **flags)


def test_binding_stage_reports_its_global_layer_ids():
    p = plan("qwen3-8b", tp_size=1, pp_size=2)  # default fraction: stage 1's extra 8 KiB costs it a token
    (_, _, _, _, t0), (_, _, _, _, t1) = p.pp_stages
    assert t1 == t0 - 1 and p.pp_binding_stage == 1 and p.max_total_num_tokens == t1
    assert p.full_attention_layer_ids == tuple(range(18, 36))
