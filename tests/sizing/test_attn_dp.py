"""--attn-dp-size: attention DP groups inside the TP group, sized by hand (pools/sizing/parallel.py).

The hand sums below use only config.json numbers and SGLang's sharding rules: under attention DP the attention
projections and the input embedding shard over attn_tp = tp / attn_dp ranks, the LM head, MoE and dense MLP over
all tp; every group keeps its own requests' KV, so the whole server holds attn_dp x the per-rank tokens.
"""

import json

import pytest

from poolsim.pools.errors import SizingError
from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.plan import max_concurrency, plan_memory
from poolsim.pools.sizing.server_args import ServerArgs

H200 = get_gpu("H200")
GIB = 1 << 30


def plan(name, **flags):
    return plan_memory(ModelConfig.load(name), H200, ServerArgs(**flags))


def fp8(out, inp):
    """An fp8 weight with 128x128 float32 block scales."""
    return out * inp + -(-out // 128) * -(-inp // 128) * 4


def deepseek_v3_attn_embed_bytes(attn_tp):
    """The DeepSeek-V3 tensors attention DP re-shards, per rank at an attention width of attn_tp (61 layers)."""
    heads = 128 // attn_tp
    q_b = fp8(heads * (128 + 64), 1536)  # q_b_proj: ColumnParallel over attn_tp
    kv_b = fp8(heads * (128 + 128), 512)  # kv_b_proj
    o = fp8(7168, heads * 128)  # o_proj: RowParallel
    w_kc_w_vc = heads * (128 + 128) * 512 * 2  # post-load bf16 split of kv_b_proj
    embed = (129280 // attn_tp) * 7168 * 2  # vocab 129280 (a multiple of 64) over attn_tp, bf16
    return 61 * (q_b + kv_b + o + w_kc_w_vc) + embed


def test_mla_attn_dp8_holds_8x_its_per_rank_tokens_with_replicated_attention():
    tp = plan("deepseek-v3", tp_size=8, mem_fraction_static=0.886)
    dp = plan("deepseek-v3", tp_size=8, attn_dp_size=8, mem_fraction_static=0.886)
    assert (dp.tp_size, dp.attn_tp_size, dp.attn_dp_size) == (8, 1, 8)
    # the weights: attention + embedding go from 1/8 to whole on every rank
    extra = deepseek_v3_attn_embed_bytes(1) - deepseek_v3_attn_embed_bytes(8)
    assert extra == 12_593_607_040  # B, 11.73 GiB more per rank
    assert round((dp.weights_gib_per_rank - tp.weights_gib_per_rank) * GIB) == extra
    # the same MLA cell: one latent head of 512 + 64, bf16, 61 layers
    assert dp.cell_size_bytes == tp.cell_size_bytes == (512 + 64) * 2 * 61 == 70_272
    # per rank: the budget left after the heavier weights, floored to whole tokens
    pre = dp.pre_model_load_gib
    rest = pre - dp.weights_gib_per_rank - pre * (1 - 0.886)
    assert dp.max_total_num_tokens == int(rest * GIB) // 70_272 == 464_203
    # the whole server: each of the 8 groups its own requests; plain TP replicates one latent pool on all ranks
    assert dp.server_max_total_num_tokens == 8 * 464_203 == 3_713_624
    assert tp.server_max_total_num_tokens == tp.max_total_num_tokens == 643_416
    assert 5.7 < dp.server_max_total_num_tokens / tp.server_max_total_num_tokens < 5.8
    # request rows per DP worker (max(2048, ...) with the default estimate), 8 of them
    assert dp.max_running_requests == 2048 and dp.server_max_running_requests == 16_384
    c = max_concurrency(dp, [1024])[0]
    assert c.kv_limit == 8 * (464_203 // 1024) and c.max_concurrency == c.kv_limit


def test_mla_attn_dp_defaults_mem_fraction_and_chunk():
    """reserve_for_graph_mb's DP term (memory_hook.py:370-378) and chunked_prefill // attn_dp (parallel_hook.py:331)."""
    dp = plan("deepseek-v3", tp_size=8, attn_dp_size=8)
    mib = H200.memory_mib
    # 512 metadata + 8192 * 1.5 activations + tp/8 GiB + decode graphs 512 * 2 + DP 512 * 8 * (3 + 1.5) + MLA 1.5 GiB
    reserved = 512 + 8192 * 1.5 + 1024 + 1024 + 512 * 8 * 4.5 + 1536
    assert dp.mem_fraction_static == round((mib - reserved) / mib, 3) == 0.758
    assert dp.chunked_prefill_size == 8192 // 8
    pre = dp.pre_model_load_gib
    rest = pre - dp.weights_gib_per_rank - pre * (1 - 0.758)
    assert dp.max_total_num_tokens == int(rest * GIB) // 70_272
    assert dp.server_max_total_num_tokens == 8 * dp.max_total_num_tokens


def qwen3_8b_attn_embed_bytes(attn_tp):
    """Qwen3-8B's q/k/v/o (36 layers; 32 heads, 8 KV heads of 128, hidden 4096) and embedding, bf16, per rank."""
    q = 32 // attn_tp * 128 * 4096
    kv = 2 * max(1, 8 // attn_tp) * 128 * 4096
    o = 4096 * 32 // attn_tp * 128
    embed = 151936 // attn_tp * 4096  # vocab 151936 (a multiple of 64)
    return 2 * (36 * (q + kv + o) + embed)


def test_gqa_attn_dp_gains_no_kv_capacity():
    """GQA: attention TP 2 keeps 4 KV heads per rank, 4x plain TP 8's one, so 4 groups hold what one TP group held
    (less the replicated attention's cost)."""
    tp = plan("qwen3-8b", tp_size=8, mem_fraction_static=0.85)
    dp = plan("qwen3-8b", tp_size=8, attn_dp_size=4, mem_fraction_static=0.85)
    assert (dp.attn_tp_size, dp.kv_head_num, tp.kv_head_num) == (2, 4, 1)
    assert tp.cell_size_bytes == 1 * 128 * 2 * 2 * 36 == 18_432
    assert dp.cell_size_bytes == 4 * 18_432
    extra = qwen3_8b_attn_embed_bytes(2) - qwen3_8b_attn_embed_bytes(8)
    assert round((dp.weights_gib_per_rank - tp.weights_gib_per_rank) * GIB) == extra
    pre = dp.pre_model_load_gib
    rest = pre - dp.weights_gib_per_rank - pre * (1 - 0.85)
    assert dp.max_total_num_tokens == int(rest * GIB) // 73_728
    assert dp.server_max_total_num_tokens == 4 * dp.max_total_num_tokens
    ratio = dp.server_max_total_num_tokens / tp.server_max_total_num_tokens
    assert 0.97 < ratio < 1.0


def test_max_running_requests_is_per_dp_worker():
    """resolve_max_num_reqs: max(1, requested // attn_dp) per worker (kv_cache_configurator.py:3127-3128)."""
    dp = plan("deepseek-v3", tp_size=8, attn_dp_size=8, max_running_requests=100)
    assert dp.max_running_requests == 12 and dp.server_max_running_requests == 96


@pytest.mark.parametrize("flags, match", [
    (dict(tp_size=8, attn_dp_size=3), "not divisible by --attn-dp-size 3"),
    (dict(tp_size=8, attn_dp_size=2, dp_size=2), "data-parallel replicas combined"),
    (dict(tp_size=8, attn_dp_size=2, moe_dense_tp_size=4), "only unset, 1 or --tp 8"),
])
def test_sglang_checks(flags, match):
    with pytest.raises(SizingError, match=match):
        plan("deepseek-v3", **flags)


def test_model_without_an_attention_dp_layout_is_refused():
    with pytest.raises(SizingError, match="not for LlamaForCausalLM"):
        plan("llama-3.1-8b", tp_size=8, attn_dp_size=8)


def test_attn_tp_must_divide_heads():
    model = ModelConfig.load("qwen3-8b")  # 32 heads: attention TP 12 (24 / 2) does not divide them
    with pytest.raises(SizingError, match=r"attention TP 12 \(--tp 24 / --attn-dp-size 2\) does not divide"):
        plan_memory(model, H200, ServerArgs(tp_size=24, attn_dp_size=2))


def test_moe_dense_tp_1_replicates_the_dense_mlp():
    """DeepSeek-V3's 3 dense layers (intermediate 18432) whole on every rank (models/deepseek_v2.py:2665)."""
    base = plan("deepseek-v3", tp_size=8, attn_dp_size=8, mem_fraction_static=0.886)
    rep = plan("deepseek-v3", tp_size=8, attn_dp_size=8, moe_dense_tp_size=1, mem_fraction_static=0.886)
    per_layer = lambda t: fp8(2 * 18432 // t, 7168) + fp8(7168, 18432 // t)  # noqa: E731
    assert round((rep.weights_gib_per_rank - base.weights_gib_per_rank) * GIB) == 3 * (per_layer(1) - per_layer(8))


def test_plan_json_and_table(tmp_path):
    from typer.testing import CliRunner

    from poolsim.cli import app

    r = CliRunner().invoke(app, ["plan", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--attn-dp-size",
                                 "8", "--mem-fraction-static", "0.886", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["parallel"] == dict(tp=8, attn_tp=1, attn_dp=8, ep=1, pp=1, nnodes=1)
    assert d["max_total_num_tokens"] == 464_203 and d["server_max_total_num_tokens"] == 3_713_624
    assert d["concurrency"][0]["kv_limit"] == 8 * (464_203 // 1024)
    r = CliRunner().invoke(app, ["plan", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--attn-dp-size",
                                 "8", "--mem-fraction-static", "0.886"])
    assert r.exit_code == 0, r.output
    assert "tp 8 = 8 attention-DP groups x attn_tp 1" in r.stdout
    assert "464,203 per rank; whole server 3,713,624" in r.stdout
    r = CliRunner().invoke(app, ["plan", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--json"])
    assert json.loads(r.stdout)["parallel"] == dict(tp=8, attn_tp=8, attn_dp=1, ep=1, pp=1, nnodes=1)


def test_speculative_with_attention_dp_is_refused():
    with pytest.raises(SizingError, match="draft's weights and pools shard under attention DP"):
        plan("deepseek-v3", tp_size=8, attn_dp_size=8, speculative_algorithm="NEXTN")
