"""Issue #14: Qwen3.5, LFM2, Granite-4.0-H, GLM-4.7-Flash, Grok-2 on the pools poolsim already has.

Every expected number is derived by hand from the config.json files (shared/hf_configs, bundled in the
catalog) and the SGLang 0.5.23 code paths named next to it.
"""

from pathlib import Path

import pytest

from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.plan import plan_memory
from poolsim.pools.sizing.server_args import ServerArgs

H100, B200 = get_gpu("h100"), get_gpu("b200")
GRANITE = Path(__file__).with_name("data") / "granite-4.0-h-tiny.test.json"


def plan(name, gpu=H100, **flags):
    return plan_memory(ModelConfig.load(name), gpu, ServerArgs(**flags))


# ---- Qwen3.5 (text_config; GDN + attention every full_attention_interval) -------------------------


def test_qwen3_5_9b_reads_its_text_config_layers_and_state():
    m = ModelConfig.load("qwen3.5-9b")
    assert m.architecture == "Qwen3_5ForConditionalGeneration" and m.hidden_size == 4096
    assert m.full_attention_layer_ids == [3, 7, 11, 15, 19, 23, 27, 31]  # (i + 1) % 4 == 0
    assert len(m.linear_layer_ids) == 24 and m.linear_attn.kind == "gdn"
    assert (m.num_key_value_heads, m.head_dim, m.mamba_ssm_dtype) == (4, 256, "float32")
    assert m.attn_output_gate and m.moe is None and m.intermediate_size == 12288


def test_qwen3_5_9b_counts_its_vision_tower_weights():
    m = ModelConfig.load("qwen3.5-9b")
    h, inter, depth = 1152, 4304, 27
    patch_embed = h * 3 * 2 * 16 * 16 + h  # Conv3d (temporal 2, 16 x 16) with bias
    pos_embed = 2304 * h
    block = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (inter * h + inter) + (h * inter + h)
    merger = 2 * h + (4 * h * 4 * h + 4 * h) + (4096 * 4 * h + 4096)  # LayerNorm, fc1, fc2 (spatial merge 2 x 2)
    vision = sum(t.numel for t in m.weight_tensors() if t.name.startswith("visual"))
    assert vision == patch_embed + pos_embed + depth * block + merger == 456_010_480
    assert m.active_param_count() == sum(t.numel * t.active for t in m.weight_tensors()
                                         if not t.name.startswith("visual") and t.name != "embed_tokens")


def test_qwen3_5_9b_plan_per_token_and_per_slot_bytes():
    p = plan("qwen3.5-9b", max_total_tokens=100_000)
    # KV: 4 kv heads x (256 + 256) x 2 B = 4,096 B per attention layer, 8 layers
    assert p.cell_size_bytes == 4 * 512 * 2 * 8 == 32_768
    # GDN slot: conv (16*128*2 + 32*128 = 8,192 channels, kernel 4 - 1) bf16 + temporal (32, 128, 128) fp32
    assert p.mamba_conv_shape == ((8192, 3),) and p.mamba_temporal_shape == (32, 128, 128)
    assert p.mamba_bytes_per_slot == 24 * (8192 * 3 * 2 + 32 * 128 * 128 * 4) == 51_511_296
    # _MAMBA_EXTRA_BUFFER_ARCHS lists Qwen3_5ForConditionalGeneration: auto -> extra_buffer with overlap
    assert (p.mamba_strategy, p.mamba_ratio, p.attention_backend, p.page_size) == ("extra_buffer", 5, "fa3", 1)


def test_qwen3_5_on_blackwell_takes_the_qwen3_5_override():
    # model_overrides/qwen3_5.py: trtllm_mha at page 64 unless the radix cache runs without the extra buffer
    p = plan("qwen3.5-397b-a17b", B200, tp_size=8, max_total_tokens=100_000)
    assert (p.attention_backend, p.page_size) == ("trtllm_mha", 64)


def test_qwen3_5_moe_reads_experts_and_shared_expert():
    m = ModelConfig.load("qwen3.5-397b-a17b")
    assert (m.moe.num_experts, m.moe.top_k, m.moe.intermediate_size, m.moe.shared_intermediate_size) == (
        512, 10, 1024, 1024)
    assert m.moe.shared_expert_gate and len(m.full_attention_layer_ids) == 15


def test_qwen3_5_layer_types_that_disagree_with_the_interval_are_refused(tmp_path):
    import json

    cfg = json.loads(Path(ModelConfig.load("qwen3.5-9b").source).read_text())
    cfg["text_config"]["layer_types"][0] = "full_attention"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"'text_config.layer_types' disagrees with full_attention_interval 4"):
        ModelConfig.load(path)


# ---- LFM2 (short conv: conv state only) ----------------------------------------------------------


def test_lfm2_layers_and_param_count_by_hand():
    m = ModelConfig.load("lfm2-700m")
    assert m.full_attention_layer_ids == [2, 5, 8, 10, 12, 14]  # full_attn_idxs
    assert m.linear_layer_ids == [0, 1, 3, 4, 6, 7, 9, 11, 13, 15] and m.linear_attn.kind == "short_conv"
    # Lfm2MLP: int(2 * 10240 / 3) = 6826, rounded up to a multiple of 256
    assert m.intermediate_size == 6912 and m.tie_word_embeddings and m.head_dim == 1536 // 24 == 64
    embed = 65536 * 1536  # tied: no lm_head
    norms = (2 * 16 + 1) * 1536
    attn = 6 * (1536 * 1536 + 2 * 512 * 1536 + 1536 * 1536 + 2 * 64)  # q, k, v, out_proj, q/k layernorm
    conv = 10 * (3 * 1536 * 1536 + 1536 * 3 + 1536 * 1536)  # in_proj (B, C, x), conv weight, out_proj
    mlp = 16 * 3 * 6912 * 1536  # w1, w3, w2
    assert m.param_count() == embed + norms + attn + conv + mlp == 742_489_344  # LFM2-700M: 742M


def test_lfm2_plan_has_a_conv_only_state_and_no_buffer():
    p = plan("lfm2-700m", tp_size=2, max_total_tokens=100_000)
    # Lfm2Config.mamba2_cache_params: conv (hidden / tp, conv_L_cache - 1), temporal state_size 0
    assert p.mamba_conv_shape == ((768, 2),) and p.mamba_temporal_shape == (1, 1536, 0)
    assert p.mamba_bytes_per_slot == 10 * 768 * 2 * 2 == 30_720
    assert p.cell_size_bytes == 4 * (64 + 64) * 2 * 6 == 6_144  # 8 kv heads / tp 2
    # not in _MAMBA_EXTRA_BUFFER_ARCHS: auto -> no_buffer and the overlap scheduler off; 3 slots per request
    assert (p.mamba_strategy, p.overlap_forced_off, p.mamba_ratio) == ("no_buffer", True, 3)


# ---- Granite-4.0-H (Mamba2 + attention + MoE) -----------------------------------------------------


def test_granite_4_0_h_tiny_layers_state_and_kv():
    # tests/sizing/data: built from the published architecture fields (no verified config.json available)
    m = ModelConfig.load(GRANITE)
    assert m.full_attention_layer_ids == [5, 15, 25, 35] and len(m.linear_layer_ids) == 36
    assert (m.moe.num_experts, m.moe.top_k, m.moe.intermediate_size, m.moe.shared_intermediate_size) == (
        64, 6, 512, 1024)
    p = plan_memory(m, H100, ServerArgs(max_total_tokens=50_000))
    assert p.cell_size_bytes == 4 * (128 + 128) * 2 * 4 == 8_192
    # MambaMixer2: inner 2 x 1536 = 3072; conv (3072 + 2 x 1 x 128, 3) bf16; temporal (48, 64, 128) fp32
    assert p.mamba_conv_shape == ((3328, 3),) and p.mamba_temporal_shape == (48, 64, 128)
    assert p.mamba_bytes_per_slot == 36 * (3328 * 3 * 2 + 48 * 64 * 128 * 4) == 57_341_952
    assert p.mamba_strategy == "extra_buffer"


def test_granite_param_count_by_hand():
    m = ModelConfig.load(GRANITE)
    h, v = 1536, 100352
    attn = 4 * (h * h + 2 * 512 * h + h * h)  # q, k, v (4 kv heads x 128), o
    inner, conv_dim = 3072, 3328
    mamba = 36 * (h * (inner + conv_dim + 48) + conv_dim * 5 + 3 * 48 + inner + h * inner)
    moe = 40 * (64 * h + 64 * (2 * 512 * h + h * 512) + 2 * 1024 * h + h * 1024)  # router, experts, shared
    norms = (2 * 40 + 1) * h
    assert m.param_count() == v * h + attn + mamba + moe + norms  # tied embeddings


# ---- GLM-4.7-Flash (MLA) and Grok-2 (GQA, MoE + residual MLP) -------------------------------------


def test_glm_4_7_flash_mla_cell_and_float32_router():
    m = ModelConfig.load("glm-4.7-flash")
    assert m.use_mla and (m.kv_lora_rank, m.qk_rope_head_dim, m.q_lora_rank) == (512, 64, 768)
    p = plan("glm-4.7-flash", max_total_tokens=100_000)
    assert p.cell_size_bytes == (512 + 64) * 2 * 47 == 54_144
    gate = next(t for t in m.weight_tensors() if t.name == "moe.gate")
    assert (gate.count, gate.dtype_bytes) == (46, 4)  # first_k_dense_replace 1; Glm4MoeLiteGate is float32


def test_grok_2_weight_bytes_per_rank_by_hand():
    m = ModelConfig.load("grok-2")
    tp = 8
    embed = 131072 // tp * 8192 * 2  # and the same for the untied lm_head
    norms = (4 * 64 + 1) * 8192 * 2  # pre/post attention and pre/post MoE per layer, final norm
    attn = 64 * (1024 * 8192 + 128 * 8192 + 128 * 8192 + 8192 * 1024) * 2  # q, k, v (1 kv head), o
    residual_mlp = 64 * (2 * 32768 // tp * 8192 + 8192 * 32768 // tp) * 2
    router = 64 * 8 * 8192 * 4  # float32
    experts = 64 * 8 * (2 * 16384 // tp * 8192 + 8192 * 16384 // tp) * 2
    assert m.weight_bytes_per_rank(tp) == 2 * embed + norms + attn + residual_mlp + router + experts \
        == 67_398_287_360


def test_quantized_checkpoints_count_their_storage():
    # gpt-oss: mxfp4 experts (half a byte per weight + one uint8 scale per 32); attention stays bf16
    m = ModelConfig.load("gpt-oss-20b")
    w13 = next(t for t in m.weight_tensors() if t.name == "moe.experts.w13")
    assert (w13.out_features, w13.in_features, w13.count) == (2 * 2880, 2880, 24 * 32)
    bf16 = ModelConfig.load("gpt-oss-20b").weight_bytes_per_rank(1)
    assert m.quant_method == "mxfp4" and m.dtype == "bfloat16"
    numel = 24 * 32 * 3 * 2880 * 2880  # w13 + w2 weights
    assert bf16 - sum(t.numel * 2 for t in m.weight_tensors() if t.name not in ("moe.experts.w13", "moe.experts.w2")
                      ) == numel // 2 + numel // 32
