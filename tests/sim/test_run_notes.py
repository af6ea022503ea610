"""`run` says what poolsim assumed reading the model, as `plan` does (its `note` rows), before the result."""

import json

from typer.testing import CliRunner

from poolsim.cli import app
from poolsim.pools.model.config import ModelConfig


def test_run_prints_the_plain_decoder_assumption(tmp_path):
    cfg = json.loads(open(ModelConfig.load("llama-3.1-8b").source).read())
    cfg["architectures"] = ["AcmeForCausalLM"]  # not a family poolsim knows, but Llama-like fields
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 100, "output_length": 3, "hash_ids": [0]}\n')
    res = CliRunner().invoke(app, ["run", str(trace), "--model", str(path), "--gpu", "H100", "--quiet",
                                   "--step-time", "fixed:10"])
    assert res.exit_code == 0, res.output
    notes = [line for line in res.output.splitlines() if line.startswith("note: ")]
    assert notes == ["note: not in poolsim's families: read as a Llama-like decoder (GQA on every layer, SwiGLU "
                     "MLP, RMSNorm, no biases, SGLang's default backend and overrides)"]
