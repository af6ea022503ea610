"""Issue #37, item 1: the 2026 configs (shared/hf_configs, bundled in the catalog) sized as SGLang 0.5.23 sizes them,
or refused naming what poolsim does not model.

Every expected number is derived by hand from the config.json fields, in the comments, and the SGLang 0.5.23 code
path named beside it; none is copied from poolsim's output.
"""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from poolsim.cli import app
from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.plan import SizingError, plan_memory
from poolsim.pools.sizing.pool_configurator import pool_configurator
from poolsim.pools.sizing.server_args import ServerArgs

GIB = 2**30
H100, H200, B200 = get_gpu("h100"), get_gpu("h200"), get_gpu("b200")
SHARED = Path(__file__).parents[3] / "shared" / "hf_configs"
runner = CliRunner()


def plan(name, gpu=H200, **flags):
    return plan_memory(ModelConfig.load(name), gpu, ServerArgs(**flags))


def gb(nbytes):
    return f"{nbytes / GIB:.2f}"


# ---- Nemotron-3 Super: Mamba2 + attention + latent MoE -------------------------------------------


def test_nemotron_3_super_experts_work_in_the_latent():
    m = ModelConfig.load("nemotron-3-super-120b-a12b")
    assert m.moe.latent_size == 1024 and not m.moe.gated  # moe_latent_size; relu2 experts (up + down)
    # 512 experts x (up 2,688 x 1,024 + down 1,024 x 2,688) on each of the 40 E blocks
    experts = sum(t.numel for t in m.weight_tensors() if t.name.startswith("moe.experts"))
    assert experts == 40 * 512 * 2 * 2688 * 1024 == 112_742_891_520
    # fc1_latent_proj 4,096 -> 1,024 and fc2_latent_proj 1,024 -> 4,096, replicated
    assert sum(t.numel for t in m.weight_tensors() if t.name == "moe.latent_proj") == 40 * 2 * 1024 * 4096


def test_nemotron_3_super_weights_per_rank_at_tp8_by_hand():
    m = ModelConfig.load("nemotron-3-super-120b-a12b")
    bf16 = 2
    embed = lm_head = 131072 // 8 * 4096 * bf16  # vocab 131,072 (already a multiple of 64) over 8 ranks
    norms = (88 + 1) * 4096 * bf16  # one RMSNorm per block + norm_f
    # 8 attention layers: 32 heads x 128 over 8; 2 kv heads < tp 8 -> one head replicated per rank
    attn = 8 * bf16 * (4 * 128 * 4096 + 128 * 4096 + 128 * 4096 + 4096 * 4 * 128)
    # 40 Mamba2 layers: inner 128 x 64 = 8,192; conv dim 8,192 + 2 x 8 groups x 128 = 10,240;
    # in_proj 8,192 + 10,240 + 128 heads = 18,560 rows; conv1d weight + bias (kernel 4 + 1)
    mamba = 40 * bf16 * (18560 // 8 * 4096 + 10240 // 8 * 5 + 3 * 128 // 8 + 8192 // 8 + 4096 * 8192 // 8)
    # 40 MoE blocks: router 512 x 4,096; experts col/row sharded in the latent (2,688 / 8 = 336);
    # latent projections replicated; e_score_correction_bias float32; shared expert 5,376 / 8 = 672
    moe = 40 * (bf16 * 512 * 4096 + bf16 * 512 * 2 * 336 * 1024 + bf16 * 2 * 1024 * 4096 + 4 * 512
                + bf16 * 2 * 672 * 4096)
    assert m.weight_bytes_per_rank(8) == embed + lm_head + norms + attn + mamba + moe == 30_914_477_824
    assert gb(m.weight_bytes_per_rank(8)) == "28.79"  # the ignored latent gave "487.89 GiB per rank"


def test_nemotron_3_super_plan_pools_at_tp8():
    p = plan("nemotron-3-super-120b-a12b", tp_size=8, max_total_tokens=100_000)
    # 8 attention layers x 1 kv head per rank x (128 + 128) x 2 B
    assert p.cell_size_bytes == 8 * 256 * 2 == 4_096
    # Mamba2 slot, tp 8: conv (8,192 + 2 x 8 x 128) / 8 = 1,280 channels x 3 bf16; temporal 16 x 64 x 128 fp32
    assert p.mamba_conv_shape == ((1280, 3),) and p.mamba_temporal_shape == (16, 64, 128)
    assert p.mamba_bytes_per_slot == 40 * (1280 * 3 * 2 + 16 * 64 * 128 * 4) == 21_278_720
    assert p.mamba_ssm_dtype == "float32"  # mamba_ssm_cache_dtype is not a field SGLang reads


# ---- Kimi-K3: KDA + MLA, full-rank gate, output gate, latent MoE, MXFP4 experts ---------------------


def test_kimi_k3_layers_state_and_kv():
    m = ModelConfig.load("kimi-k3")
    mla = json.loads(Path(m.source).read_text())["text_config"]["linear_attn_config"]["full_attn_layers"]
    assert m.full_attention_layer_ids == [i - 1 for i in mla] and len(m.linear_layer_ids) == 69  # 1-based lists
    assert m.linear_attn.full_rank_gate and m.moe.latent_size == 3584 and m.moe.latent_norm
    assert (m.moe.num_experts, m.moe.top_k, m.moe.shared_intermediate_size) == (896, 16, 2 * 3072)
    p = plan_memory(m, B200, ServerArgs(tp_size=16, max_total_tokens=100_032))
    assert p.cell_size_bytes == 24 * (512 + 64) * 2 == 27_648  # MLA latent, the same on every rank
    # KDA slot, tp 16: conv 3 x 12,288 / 16 = 2,304 channels x 3 bf16; temporal 6 heads x 128 x 128 fp32
    assert p.mamba_bytes_per_slot == 69 * (2304 * 3 * 2 + 6 * 128 * 128 * 4) == 28_085_760
    # model_overrides/kimi_k3.py:122-135 picks trtllm_mla on SM100 (64-token pages); K3 takes the extra buffer
    assert (p.attention_backend, p.page_size, p.mamba_strategy) == ("trtllm_mla", 64, "extra_buffer")
    assert p.mm_reservation_gib == 100 / 1024  # structurally multimodal: the VLM cache is reserved


def test_kimi_k3_full_rank_kda_and_mla_output_gate_weights():
    m = ModelConfig.load("kimi-k3")
    n = {t.name: t for t in m.weight_tensors()}
    proj = 96 * 128
    assert n["kda.q_k_v_g_proj"].numel == 69 * 4 * proj * 7168  # q, k, v and the full-rank g
    assert n["kda.f_a_proj"].numel == 69 * 128 * 7168 and n["kda.f_b_proj"].numel == 69 * proj * 128
    assert "kda.f_a_g_a_proj" not in n
    assert n["attn.g_proj"].numel == 24 * 96 * 128 * 7168  # mla_use_output_gate
    # the merged f_a + b_proj buffer at tp 8: 128 + 96 / 8 = 140 rows padded to 144 (kimi_k3.py:1850)
    assert n["kda.bfa_pad_rows"].shape_per_rank(8) == (4, 7168) and n["kda.bfa_pad_rows"].shape_per_rank(4) == (0, 7168)


def test_kimi_k3_expert_bytes_depend_on_the_gpu():
    m = ModelConfig.load("kimi-k3")
    experts = 92 * 896  # MoE layers (first_k_dense_replace 1) x routed experts
    # sm100, tp 16: flashinfer_mxfp4 pads 3,072 / 16 = 192 up to 256; e2m1 (half a byte) + one ue8m0 per 32;
    # biases float32; gemm1 alpha/beta/clamp float32
    packed = (2 * 256 * 3584 // 2 + 2 * 256 * 3584 // 32 + 3584 * 256 // 2 + 3584 * 256 // 32
              + 4 * (2 * 256 + 3584) + 4 * 3)
    # sm90, tp 16: the auto runner upcasts to bf16 (192 is already a multiple of 64); bf16 biases
    upcast = 2 * (2 * 192 * 3584 + 3584 * 192) + 2 * (2 * 192 + 3584)
    assert (packed, upcast) == (1_478_668, 4_136_704)
    diff = m.weight_bytes_per_rank(16, "sm90") - m.weight_bytes_per_rank(16, "sm100")
    assert diff == experts * (upcast - packed)


def test_kimi_k3_does_not_fit_8_h200_and_plans_on_16_b200():
    with pytest.raises(SizingError, match=r"weights need 658\.\d\d GiB per rank"):
        plan("kimi-k3", H200, tp_size=8)  # bf16 experts: 92 x 896 x 3 x 3,072 x 3,584 x 2 B / 8 alone
    p = plan("kimi-k3", B200, tp_size=16)
    assert p.max_total_num_tokens > 0 and p.rows_capped_by_mamba


def test_kimi_k3_refuses_an_unknown_quantization_layout(tmp_path):
    cfg = json.loads(Path(ModelConfig.load("kimi-k3").source).read_text())
    cfg["text_config"]["quantization_config"]["ignore"].remove("re:.*self_attn.*")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"'text_config.quantization_config.ignore' lacks 're:.\*self_attn.\*'"):
        ModelConfig.load(path)
    with pytest.raises(SizingError, match=r"MXFP4 experts there .* is not modelled"):
        plan("kimi-k3", get_gpu("mi300x"), tp_size=8)


# ---- Gemma 4: windowed and full layers with their own geometry, hybrid SWA pools ----------------------


def test_gemma_4_31b_geometry_and_pool_split():
    m = ModelConfig.load("gemma-4-31b")
    assert [i for i in range(60) if i not in m.swa_layer_ids] == list(range(5, 60, 6)) and m.is_hybrid_swa
    # SGLang's base is full attention: global_head_dim 512, num_global_key_value_heads 4; swa_* the window's
    assert (m.head_dim, m.v_head_dim, m.num_key_value_heads) == (512, 512, 4)
    assert (m.swa.head_dim, m.swa.num_key_value_heads, m.sliding_window) == (256, 16, 1024)
    # tp 1: F_tok 4 x (512 + 512) x 2 = 8,192; S_tok 16 x (256 + 256) x 2 = 16,384
    tp1 = pool_configurator(m, 1, 1, "bfloat16")
    assert tp1.per_token() == (8_192, 16_384) and tp1.cell_size() == pytest.approx(8_192 * 10 + 0.8 * 16_384 * 50)
    # tp 8: 4 // 8 -> 1 full kv head, 16 // 8 = 2 windowed: 2,048 B each
    p = plan_memory(m, H200, ServerArgs(tp_size=8, max_total_tokens=100_000))
    assert p.cell_size_bytes == pytest.approx(2_048 * 10 + 0.8 * 2_048 * 50) and p.attention_backend == "triton"
    assert (p.full_max_total_num_tokens, p.swa_max_total_num_tokens) == (100_000, 80_000)
    # K per pool: (tokens + page) rows x heads x head_dim x 2 B x layers
    assert gb(p.full_k_size_gib * GIB) == gb(100_001 * 1 * 512 * 2 * 10) == "0.95"
    assert gb(p.swa_k_size_gib * GIB) == gb(80_001 * 2 * 256 * 2 * 50) == "3.81"


def test_gemma_4_31b_weights_per_rank_at_tp8_by_hand():
    m = ModelConfig.load("gemma-4-31b")
    b = 2
    embed = 262144 * 5376 * b  # nn.Embedding on every rank, tied to the LM head
    norms = (4 * 60 + 1) * 5376 * b
    # 10 full layers: q 32 x 512 / 8; k, v one 512-wide head per rank (4 kv heads < tp 8); q/k norms, v_norm buffer
    full = 10 * b * (2048 * 5376 + 2 * 512 * 5376 + 5376 * 2048 + 2 * 512 + 512)
    # 50 windowed layers: q 32 x 256 / 8; k, v 16 / 8 = 2 heads of 256
    swa = 50 * b * (1024 * 5376 + 2 * 512 * 5376 + 5376 * 1024 + 2 * 256 + 256)
    mlp = 60 * b * (2 * 21504 // 8 * 5376 + 5376 * 21504 // 8) + 60 * b  # gated GELU; layer_scalar
    # vision tower (27 blocks, 16 heads of 72 over 8 ranks) + embed_vision
    vision = b * (1152 * 768 + 2 * 10240 * 1152
                  + 27 * (144 * 1152 + 2 * 144 * 1152 + 1152 * 144 + 2 * 72 + 72
                          + 2 * 4304 // 8 * 1152 + 1152 * 4304 // 8 + 4 * 1152 + 1)
                  + 5376 * 1152 + 1152 + 2 * 1152)
    assert m.weight_bytes_per_rank(8) == embed + norms + full + swa + mlp + vision == 10_423_373_118


def test_gemma_4_reserves_the_multimodal_cache_and_skips_the_prefill_graph():
    p = plan("gemma-4-31b", tp_size=8)
    assert p.mm_reservation_gib == 100 / 1024
    assert p.rest_gib == pytest.approx(p.available_after_weights_gib - p.non_static_headroom_gib - 100 / 1024)
    # reserved MiB: 512 + 8,192 x 1.5 + 8 x 128 + 512 decode graphs x 2, no prefill graphs (multimodal, off the
    # breakable-graph allowlist); H200 reads 143,771 MiB
    base = round((143771 - (512 + 12288 + 1024 + 1024)) / 143771, 3)
    # adjust_mem_fraction_for_vlm: ViT 27 x 1,152^2 against 24 x 1,024^2 is 1.423828125 -> 0.95 x (1 - 0.0423828125)
    assert (base, p.mem_fraction_static) == (0.897, pytest.approx(0.897 * 0.95 * (1 - 0.1 * 0.423828125)))


def test_gemma_4_26b_a4b_moe_block_beside_the_dense_mlp():
    m = ModelConfig.load("gemma-4-26b-a4b")
    assert {layer.mlp for layer in m.layers} == {"moe+dense"} and (m.moe.num_experts, m.moe.top_k) == (128, 8)
    experts = sum(t.numel for t in m.weight_tensors() if t.name.startswith("moe.experts"))
    assert experts == 30 * 128 * 3 * 704 * 2816  # gated: gate + up + down
    p = plan_memory(m, H200, ServerArgs(tp_size=8, max_total_tokens=100_000))
    # full: 2 // 8 -> 1 head x 1,024 x 2 B on 5 layers; windowed: 8 // 8 = 1 head x 512 x 2 B on 25 layers
    assert p.cell_size_bytes == pytest.approx(2_048 * 5 + 0.8 * 1_024 * 25)
    with pytest.raises(SizingError, match=r"--tp 32 does not divide num_attention_heads 16"):
        plan("gemma-4-26b-a4b", tp_size=32)


def test_gemma_4_refuses_per_layer_embeddings_and_kv_sharing(tmp_path):
    cfg = json.loads(Path(ModelConfig.load("gemma-4-31b").source).read_text())
    cfg["text_config"]["num_kv_shared_layers"] = 20
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"'text_config.num_kv_shared_layers' is 20: Gemma 4's cross-layer KV sharing"):
        ModelConfig.load(path)


# ---- GLM-5: MLA + DSA indexer, as DeepSeek-V3.2 ---------------------------------------------------------


def test_glm_5_is_mla_with_the_dsa_index_cache():
    m = ModelConfig.load("glm-5")
    assert m.use_mla and (m.dsa.index_n_heads, m.dsa.index_head_dim, m.dsa.index_topk) == (32, 128, 2048)
    # per MLA layer: q_a, its norm, q_b (64 x (192 + 64)), kv_a (512 + 64), its norm, kv_b (64 x (192 + 256)), o;
    # the indexer's wq_b, wk, weights_proj, k_norm (weight + bias); two RMSNorms
    layer = (2048 * 6144 + 2048 + 64 * 256 * 2048 + 576 * 6144 + 512 + 64 * 448 * 512 + 6144 * 64 * 256
             + 32 * 128 * 2048 + 128 * 6144 + 32 * 6144 + 2 * 128 + 2 * 6144)
    dense = 3 * 3 * 12288 * 6144  # first_k_dense_replace 3
    moe = 75 * (256 * 6144 + 256 * 3 * 2048 * 6144 + 256 + 3 * 2048 * 6144)  # router, experts, bias, shared
    assert m.param_count() == 78 * layer + dense + moe + 2 * 154880 * 6144 + 6144 == 743_911_218_432
    # B200 default KV fp8_e4m3 on trtllm kernels: raw 576 B latent + 128 B index K + 4 B scale, 78 layers
    p = plan("glm-5", B200, tp_size=16, max_total_tokens=100_032)
    assert p.cell_size_bytes == 78 * (576 + 132) == 55_224 and (p.attention_backend, p.page_size) == ("dsa", 64)


def test_glm_5_bf16_does_not_fit_8_h200():
    with pytest.raises(SizingError, match=r"weights need 176\.\d\d GiB per rank"):
        plan("glm-5", tp_size=8)


# ---- Qwen3.6: the Qwen3.5 GDN hybrid, multimodal wrapper -------------------------------------------------


def test_qwen3_6_plan_per_token_and_per_slot_bytes():
    p = plan("qwen3.6-35b-a3b", tp_size=8, max_total_tokens=100_000)
    assert p.cell_size_bytes == 10 * 1 * 512 * 2 == 10_240  # 2 kv heads // 8 -> 1 per rank, 10 attention layers
    # GDN slot, tp 8: conv (2 x 16 x 128 + 32 x 128) / 8 = 1,024 channels x 3 bf16; temporal 4 x 128 x 128 fp32
    assert p.mamba_bytes_per_slot == 30 * (1024 * 3 * 2 + 4 * 128 * 128 * 4) == 8_048_640
    assert p.mm_reservation_gib == 100 / 1024 and p.mamba_strategy == "extra_buffer"
    # reserved MiB 512 + 12,288 + 1,024 + 1,024 decode graphs + 58 prefill graph sizes up to 8,192 x 8 MiB;
    # the Qwen3-VL vision config has no num_hidden_layers, so SGLang takes 24 (of 1,152): ratio 1.265625
    base = round((143771 - (512 + 12288 + 1024 + 1024 + 58 * 8)) / 143771, 3)
    assert (base, p.mem_fraction_static) == (0.893, pytest.approx(0.893 * 0.95 * (1 - 0.1 * 0.265625)))


# ---- Llama 4 Scout: chunked attention as SGLang's SWA pool ---------------------------------------------


def test_llama_4_scout_chunked_layers_get_the_swa_pool():
    m = ModelConfig.load("llama-4-scout-17b-16e")
    assert m.is_hybrid_swa and [i for i in range(48) if i not in m.swa_layer_ids] == list(range(3, 48, 4))
    assert m.sliding_window == 8192  # attention_chunk_size
    # per layer: q 40 x 128, k/v 8 x 128, o; router 16 x 5,120; 16 gated experts of 8,192; shared expert; 2 norms
    layer = (5120 * 5120 + 2 * 1024 * 5120 + 5120 * 5120 + 16 * 5120 + 16 * 3 * 8192 * 5120 + 3 * 8192 * 5120
             + 2 * 5120)
    assert m.param_count() == 48 * layer + 2 * 202048 * 5120 + 5120 == 107_769_861_120  # no vision tower loaded
    p = plan_memory(m, H200, ServerArgs(tp_size=8, context_length=131072, max_total_tokens=100_000))
    # 8 kv heads / 8 = 1 x (128 + 128) x 2 B = 512 B: 12 full layers + 0.8 x 36 windowed
    assert p.cell_size_bytes == pytest.approx(512 * 12 + 0.8 * 512 * 36) and p.attention_backend == "fa3"
    assert p.mm_reservation_gib == 0.0  # multimodal is off for Llama 4 unless --enable-multimodal


def test_llama_4_default_context_makes_the_req_to_token_table_too_big():
    # rope_type llama3 keeps max_position_embeddings: 10,485,760 tokens x 2,049 rows x 4 B
    with pytest.raises(SizingError, match=r"req_to_token table \(2049 rows x 10485764 int32 = 80\.04 GiB\)"):
        plan("llama-4-scout-17b-16e", tp_size=8)


# ---- refused: the pool kinds poolsim does not model yet ------------------------------------------------


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared hf_configs folder is not beside this checkout")
@pytest.mark.parametrize("file, field", [("deepseek-ai__DeepSeek-V4-Flash.json", "compress_ratios"),
                                         ("MiniMaxAI__MiniMax-M3.json", "text_config.sparse_attention_config")])
def test_deepseek_v4_and_minimax_m3_are_refused_naming_the_field(file, field):
    r = runner.invoke(app, ["plan", "--model", str(SHARED / file), "--gpu", "H200", "--tp", "8"])
    assert r.exit_code == 2 and r.output.count("\n") == 1
    assert f"field '{field}' selects" in r.output and "poolsim does not model yet" in r.output


def test_gemma_3_embedding_is_replicated():
    m = ModelConfig.load("gemma-3-27b")
    # Gemma3TextScaledWordEmbedding is an nn.Embedding: 262,208 x 5,376 x 2 B on every rank
    embed = next(t for t in m.weight_tensors() if t.name == "embed_tokens")
    assert embed.shape_per_rank(4) == (262208, 5376)
