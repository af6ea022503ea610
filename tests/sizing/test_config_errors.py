"""Malformed config.json fields (issue #11) and configs no family reads (issue #14): one line, exit 2."""

import json

import pytest
from typer.testing import CliRunner

from poolsim.cli import app
from poolsim.pools.model.config import ModelConfig

runner = CliRunner()


def llama_cfg(**changes):
    cfg = json.loads(open(ModelConfig.load("llama-3.1-8b").source).read())
    cfg.update(changes)
    return cfg


def plan_exit(tmp_path, cfg):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = runner.invoke(app, ["plan", "--model", str(path), "--gpu", "h100"])
    return r, path


@pytest.mark.parametrize("field, value, message", [
    ("num_attention_heads", "32", "field 'num_attention_heads' is '32'; expected an integer"),
    ("num_hidden_layers", -2, "field 'num_hidden_layers' is -2; must be >= 1"),
    ("num_key_value_heads", 0, "field 'num_key_value_heads' is 0; must be >= 1"),
    ("hidden_size", 4096.0, "field 'hidden_size' is 4096.0; expected an integer"),
    ("head_dim", True, "field 'head_dim' is True; expected an integer"),
])
def test_malformed_fields_are_one_line_naming_the_field(tmp_path, field, value, message):
    r, path = plan_exit(tmp_path, llama_cfg(**{field: value}))
    assert r.exit_code == 2
    assert r.output.strip() == f"error: {path}: {message}"


def test_malformed_field_inside_text_config_is_named_with_its_prefix(tmp_path):
    cfg = json.loads(open(ModelConfig.load("qwen3.5-9b").source).read())
    cfg["text_config"]["num_key_value_heads"] = 0
    r, path = plan_exit(tmp_path, cfg)
    assert r.exit_code == 2 and "field 'text_config.num_key_value_heads' is 0; must be >= 1" in r.output


def test_a_plain_decoder_not_in_the_families_works_with_a_note(tmp_path):
    r, _ = plan_exit(tmp_path, llama_cfg(architectures=["OlmoLikeForCausalLM"], model_type="olmo_like"))
    assert r.exit_code == 0, r.output
    assert "read as a Llama-like decoder" in r.output
    assert "131,072 B/token" in r.output  # 8 kv heads x (128 + 128) x 2 B x 32 layers, as Llama-3.1-8B


@pytest.mark.parametrize("field, value", [
    ("sliding_window", 4096), ("layer_types", ["full_attention"] * 32), ("kv_lora_rank", 512),
    ("num_local_experts", 8), ("text_config", {}),
])
def test_an_unknown_variant_is_refused_naming_the_field(tmp_path, field, value):
    r, _ = plan_exit(tmp_path, llama_cfg(architectures=["NewThingForCausalLM"], **{field: value}))
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert f"'NewThingForCausalLM' is not supported: field '{field}'" in r.output


def test_an_unknown_non_causal_lm_is_refused(tmp_path):
    r, _ = plan_exit(tmp_path, llama_cfg(architectures=["Step3VLForConditionalGeneration"]))
    assert r.exit_code == 2 and "is not a causal LM" in r.output


def test_an_unknown_attention_backend_is_refused_with_sglangs_choices():
    r = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--attention-backend", "foo"])
    assert r.exit_code == 2
    assert r.output.startswith("error: --attention-backend 'foo' is not one of triton, torch_native, ")
    assert "fa3" in r.output and r.output.count("\n") == 1
    ok = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--attention-backend", "flashinfer"])
    assert ok.exit_code == 0 and "MHA via flashinfer" in ok.output
