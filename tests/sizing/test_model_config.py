"""ModelConfig: what SGLang parses from the real config.json files, and weights counted from the shapes.

Every expected number is worked out by hand from the config files in pools/model/catalog/.
"""

import hashlib
import json
from pathlib import Path

import pytest

from poolsim.pools.model.config import CATALOG_DIR, ModelConfig

SHARED = Path(__file__).resolve().parents[3] / "shared" / "hf_configs"


def test_catalog_has_the_issue_models_and_the_r1_alias():
    names = set(ModelConfig.catalog_names())
    assert names == {"llama-3.1-8b", "llama-3.1-70b", "qwen3-8b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3",
                     "kimi-k2", "kimi-linear-48b-a3b", "qwen3-next-80b-a3b", "nemotron-3-nano-30b-a3b",
                     # issue #14
                     "qwen3.5-9b", "qwen3.5-397b-a17b", "lfm2-700m", "glm-4.7-flash", "grok-2", "gpt-oss-20b",
                     "gpt-oss-120b", "gemma-3-27b", "deepseek-v3.2",
                     # issue #37
                     "kimi-k3", "gemma-4-31b", "gemma-4-26b-a4b", "glm-5", "qwen3.6-35b-a3b", "llama-4-scout-17b-16e",
                     "nemotron-3-super-120b-a12b"}
    r1 = ModelConfig.load("deepseek-r1")
    assert r1.name == "deepseek-r1" and r1.architecture == "DeepseekV3ForCausalLM"
    assert r1.kv_lora_rank == 512 and r1.num_hidden_layers == 61


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared hf_configs folder is not beside this checkout")
def test_catalog_files_are_byte_identical_to_the_shared_configs():
    readme = (CATALOG_DIR / "README.md").read_text()
    for path in CATALOG_DIR.glob("*.json"):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert f"| {path.stem} |" in readme and digest in readme
        twins = [p for p in SHARED.glob("*.json") if hashlib.sha256(p.read_bytes()).hexdigest() == digest]
        assert twins, f"{path.name} has no byte-identical file in shared/hf_configs"


def test_llama_3_1_8b_gqa_fields_and_llama3_rope_context():
    m = ModelConfig.load("llama-3.1-8b")
    assert (m.attention_arch, m.num_hidden_layers, m.num_attention_heads, m.num_key_value_heads) == ("mha", 32, 32, 8)
    assert m.head_dim == 4096 // 32 == m.v_head_dim == 128  # no head_dim in the file: hidden // heads
    # rope_type llama3 keeps max_position_embeddings unscaled (get_context_length)
    assert m.derived_context_len == 131072
    assert m.dtype == "bfloat16" and m.quant_method is None
    assert m.full_attention_layer_ids == list(range(32)) and m.linear_layer_ids == []
    assert m.layer_kinds == ("mha",) * 32


def test_llama_3_1_8b_param_count_by_hand():
    m = ModelConfig.load("llama-3.1-8b")
    embed = 128256 * 4096  # 525,336,576, and the same again for the untied lm_head
    per_layer = (4096 * 4096  # q_proj
                 + 2 * 1024 * 4096  # k_proj, v_proj: 8 kv heads x 128
                 + 4096 * 4096  # o_proj
                 + 3 * 14336 * 4096  # gate, up, down
                 + 2 * 4096)  # two RMSNorms
    assert per_layer == 218_112_000
    assert m.param_count() == 2 * embed + 32 * per_layer + 4096 == 8_030_261_248
    # bf16: two bytes per parameter on one rank
    assert m.weight_bytes_per_rank(1) == 2 * 8_030_261_248


def test_llama_3_1_8b_weights_per_rank_at_tp2_by_hand():
    m = ModelConfig.load("llama-3.1-8b")
    embed = 128256 // 2 * 4096  # vocab (already a multiple of 64) split over 2 ranks
    per_layer = (2048 * 4096  # q_proj: 16 heads x 128
                 + 2 * 512 * 4096  # k, v: 4 kv heads x 128
                 + 4096 * 2048  # o_proj row-parallel
                 + 2 * 7168 * 4096  # gate_up column-parallel
                 + 4096 * 7168  # down row-parallel
                 + 2 * 4096)  # norms, replicated
    assert m.weight_bytes_per_rank(2) == 2 * (2 * embed + 32 * per_layer + 4096) == 8_030_527_488


def test_qwen3_30b_a3b_moe_total_and_active_by_hand():
    m = ModelConfig.load("qwen3-30b-a3b")
    embed = 151936 * 2048  # 311,164,928; untied lm_head the same
    attn = 4096 * 2048 + 2 * 512 * 2048 + 2048 * 4096 + 2 * 128  # q, k+v (4 kv heads x 128), o, q/k norm
    router = 128 * 2048
    experts = 128 * 3 * 768 * 2048  # 128 experts of gate+up+down, moe_intermediate_size 768
    per_layer = attn + router + experts + 2 * 2048
    assert m.param_count() == 2 * embed + 48 * per_layer + 2048 == 30_532_122_624
    # active: no input embedding (a lookup); 8 of 128 experts
    active_layer = attn + router + 8 * 3 * 768 * 2048 + 2 * 2048
    assert m.active_param_count() == embed + 48 * active_layer + 2048 == 3_041_867_776
    assert m.moe.num_experts == 128 and m.moe.top_k == 8 and m.derived_context_len == 40960


def test_deepseek_v3_mla_fp8_fields():
    m = ModelConfig.load("deepseek-v3")
    assert m.attention_arch == "mla" and m.use_mla
    ranks = (m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim, m.q_lora_rank)
    assert ranks == (512, 64, 128, 128, 1536)
    # yarn rope with original_max_position_embeddings: factor ignored (get_context_length)
    assert m.derived_context_len == 163840
    assert m.quant_method == "fp8" and m.weight_block_size == (128, 128) and m.weight_dtype == "fp8_e4m3"
    # first_k_dense_replace 3: layers 0-2 dense, 3..60 MoE; n_shared_experts 1 of 2048
    assert [layer.mlp for layer in m.layers[:4]] == ["dense", "dense", "dense", "moe"]
    assert m.moe.shared_intermediate_size == 2048 and m.moe.num_experts == 256
    # the MTP layer (num_nextn_predict_layers 1) is not loaded without speculative decoding
    assert len(m.layers) == 61


def test_fp8_block_scales_and_mla_copies_on_a_tiny_deepseek():
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 256, "vocab_size": 1000,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 128,
           "kv_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 64,
           "intermediate_size": 512, "moe_intermediate_size": 128, "n_routed_experts": 4, "num_experts_per_tok": 2,
           "n_shared_experts": 1, "first_k_dense_replace": 1, "torch_dtype": "bfloat16",
           "max_position_embeddings": 4096,
           "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    m = ModelConfig.from_dict(cfg)
    scale = 4  # float32 weight_scale_inv per 128x128 block
    expected = (
        2 * 1024 * 256 * 2  # embed + lm_head, vocab padded 1000 -> 1024, bf16
        + 3 * 256 * 2  # input/post-attention norms + final norm, bf16
        + 128 * 256 + 1 * 2 * scale  # q_a_proj fp8, 1x2 blocks
        + 128 * 2  # q_a_layernorm
        + 256 * 128 + 2 * 1 * scale  # q_b_proj 2 heads x (64+64), 2x1 blocks
        + 192 * 256 + 2 * 2 * scale  # kv_a_proj_with_mqa 128+64, 2x2 blocks
        + 128 * 2  # kv_a_layernorm
        + 256 * 128 + 2 * 1 * scale  # kv_b_proj 2 x (64+64)
        + 256 * 128 + 2 * 1 * scale  # o_proj
        + 256 * 128 * 2  # w_kc / w_vc: bf16 copies of kv_b_proj made after loading
        + 1024 * 256 + 8 * 2 * scale  # gate_up (2 x 512)
        + 256 * 512 + 2 * 4 * scale)  # down
    assert expected == 1_689_744
    assert m.weight_bytes_per_rank(1) == expected


def test_kimi_linear_kda_layers_are_1_based():
    m = ModelConfig.load("kimi-linear-48b-a3b")
    # kda_layers [1,2,3,5,...,25,26] are 1-based: 0-based full-attention ids are 3,7,...,23,26
    assert m.full_attention_layer_ids == [3, 7, 11, 15, 19, 23, 26]
    assert len(m.linear_layer_ids) == 20 and m.linear_layer_ids[:4] == [0, 1, 2, 4]
    assert m.attention_arch == "mla" and (m.kv_lora_rank, m.qk_rope_head_dim) == (512, 64)
    assert m.linear_attn.kind == "kda" and (m.linear_attn.num_heads, m.linear_attn.head_dim) == (32, 128)
    assert m.linear_attn.conv_kernel == 4
    assert m.dtype == "bfloat16"  # the file says "dtype", not "torch_dtype"
    assert m.derived_context_len == 1048576  # model_max_length wins over the class default 4096
    assert m.mamba_ssm_dtype is None  # KimiLinearConfig never reads it
    assert m.layer_kinds[:4] == ("kda", "kda", "kda", "mla")


def test_qwen3_next_gdn_every_fourth_layer_is_full_attention():
    m = ModelConfig.load("qwen3-next-80b-a3b")
    assert m.full_attention_layer_ids == [3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47]
    assert len(m.linear_layer_ids) == 36
    la = m.linear_attn
    fields = (la.kind, la.num_heads, la.head_dim, la.num_k_heads, la.head_k_dim, la.conv_kernel)
    assert fields == ("gdn", 32, 128, 16, 128, 4)
    assert (m.num_key_value_heads, m.head_dim, m.attn_output_gate) == (2, 256, True)


def test_nemotron_h_pattern_and_mamba2_fields():
    m = ModelConfig.load("nemotron-3-nano-30b-a3b")
    pattern = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
    assert m.num_hidden_layers == len(pattern) == 52
    assert m.full_attention_layer_ids == [i for i, c in enumerate(pattern) if c == "*"] == [5, 12, 19, 26, 33, 42]
    assert len(m.linear_layer_ids) == pattern.count("M") == 23
    la = m.linear_attn
    assert (la.num_heads, la.head_dim, la.num_k_heads, la.head_k_dim, la.conv_kernel) == (64, 64, 8, 128, 4)
    # the file's "mamba_ssm_cache_dtype" is not the mamba_ssm_dtype SGLang reads
    assert m.mamba_ssm_dtype is None
    assert m.moe.gated is False and m.moe.shared_intermediate_size == 3712


def test_with_full_attention_replaces_every_linear_layer():
    full = ModelConfig.load("kimi-linear-48b-a3b").with_full_attention()
    assert full.full_attention_layer_ids == list(range(27)) and not full.is_hybrid
    assert full.layer_kinds == ("mla",) * 27


def test_unknown_architecture_names_the_file_and_field(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["MysteryForCausalLM"], "hidden_size": 8}))
    with pytest.raises(ValueError, match=r"config\.json: architectures\[0\] 'MysteryForCausalLM' is not supported"):
        ModelConfig.load(tmp_path)  # a folder holding config.json works too


def test_missing_field_names_the_file_and_the_field(tmp_path):
    cfg = json.loads((CATALOG_DIR / "kimi-linear-48b-a3b.json").read_text())
    del cfg["linear_attn_config"]["kda_layers"]
    path = tmp_path / "kimi.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError) as e:
        ModelConfig.load(path)
    assert str(e.value) == f"{path}: missing field 'linear_attn_config.kda_layers' needed for KimiLinearForCausalLM"
    assert "\n" not in str(e.value)


def test_unsupported_quantization_is_refused(tmp_path):
    cfg = json.loads((CATALOG_DIR / "qwen3-8b.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="quantization_config.quant_method 'awq' is not supported"):
        ModelConfig.load(path)


def test_float32_config_runs_in_float16_and_rope_factor_scales_context(tmp_path):
    cfg = json.loads((CATALOG_DIR / "qwen3-8b.json").read_text())
    cfg["torch_dtype"] = "float32"
    cfg["rope_scaling"] = {"type": "yarn", "factor": 4.0}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = ModelConfig.load(path)
    assert m.dtype == "float16"  # _get_and_verify_dtype: float32 checkpoints run in float16
    assert m.derived_context_len == 4 * 40960


def test_unknown_model_name_lists_the_catalog():
    with pytest.raises(ValueError, match=r"--model 'llama-9' is neither a config\.json nor a catalog name; known: "):
        ModelConfig.load("llama-9")


def test_the_family_registry_names_each_family_class_and_imports_it_only_when_asked():
    import importlib
    import pkgutil
    import subprocess
    import sys

    from poolsim.pools.model import families
    from poolsim.pools.model.families.base import Family

    named = set()
    for arch in families.supported_architectures():
        cls = families.family_for(arch)
        assert isinstance(cls, type) and issubclass(cls, Family), arch
        named.add(cls)
    assert families.family_for("NoSuchForCausalLM") is None
    # every concrete family class in the package is reachable from the table (none left unregistered)
    for info in pkgutil.iter_modules(families.__path__):
        module = importlib.import_module(f"{families.__name__}.{info.name}")
        for obj in vars(module).values():
            if (isinstance(obj, type) and issubclass(obj, Family) and obj.__module__ == module.__name__
                    and obj.__name__ not in ("Family", "PlainDecoder") and not obj.__name__.startswith("_")):
                assert obj in named, f"{obj.__name__} is not in ARCHITECTURES"
    # loading the config module does not import the families; parsing a Llama config imports llama.py alone
    probe = ("import sys\nfrom poolsim.pools.model.config import ModelConfig\n"
             "before = sorted(m for m in sys.modules if '.families.' in m)\n"
             "ModelConfig.load('llama-3.1-8b')\n"
             "after = sorted(m for m in sys.modules if '.families.' in m)\nprint(before, after)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] ['poolsim.pools.model.families.base', 'poolsim.pools.model.families.llama']"
