"""`poolsim plan`, `models` and `gpus` through typer's CliRunner."""

import json

import pytest
from typer.testing import CliRunner

from poolsim.cli import app

runner = CliRunner()


def run(*argv):
    return runner.invoke(app, list(argv))


def test_plan_json_has_the_logged_sizes():
    r = run("plan", "--model", "llama-3.1-8b", "--gpu", "h200", "--tp", "1", "--max-total-tokens", "442750", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    for key in ("max_total_num_tokens", "cell_size_bytes", "k_size_gib", "v_size_gib", "kv_size_gib",
                "req_to_token_rows", "req_to_token_gib", "max_running_requests", "mamba", "concurrency"):
        assert key in d
    assert d["max_total_num_tokens"] == 442750 and d["cell_size_bytes"] == 131072
    assert f"{d['k_size_gib']:.2f}" == f"{d['v_size_gib']:.2f}" == "27.02"
    assert d["kv_size_gib"] is None and d["mamba"] is None


def test_plan_json_for_a_hybrid_nests_the_mamba_pool():
    r = run("plan", "--model", "kimi-linear-48b-a3b", "--gpu", "h200", "--tp", "2", "--max-total-tokens", "100000",
            "--mamba-ssm-dtype", "bfloat16", "--json")
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout)["mamba"]
    # tp 2: conv 3 x 6144 bf16 = 36,864 B + ssm 16 x 128 x 128 bf16 = 524,288 B, per KDA layer, x 20
    assert m["bytes_per_slot"] == 20 * (3 * 6144 * 2 + 16 * 128 * 128 * 2) == 11_223_040
    assert m["ssm_state_gib"] * 2**30 == (m["max_mamba_cache_size"] + 1) * 20 * 16 * 128 * 128 * 2
    assert m["ssm_dtype"] == "bfloat16" and m["strategy"] == "extra_buffer"


def test_plan_table_shows_tokens_rows_slots_and_the_binding_pool():
    r = run("plan", "--model", "kimi-linear-48b-a3b", "--gpu", "h200", "--concurrency-at", "1024,131072")
    assert r.exit_code == 0, r.output
    for text in ("max_total_num_tokens", "KV size:", "conv_state size:", "max_running_requests", "req_to_token",
                 "mamba_slots", "kv_tokens"):
        assert text in r.stdout


@pytest.mark.parametrize("argv, message", [
    (["--model", "llama-3.1-8b", "--gpu", "h100", "--page-size", "48"], "--page-size 48 is not a power of two"),
    (["--model", "llama-3.1-70b", "--gpu", "l4"], "--tp 1: llama-3.1-70b weights need 131.42 GiB per rank"),
    (["--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "5"], "--tp 5 does not divide num_attention_heads 32"),
    (["--model", "llama-3.1-8b", "--gpu", "h100", "--max-running-requests", "40000"],
     "--context-length 131072: the req_to_token table"),
    (["--model", "llama-9", "--gpu", "h100"], "--model 'llama-9' is neither a config.json nor a catalog name"),
    (["--model", "llama-3.1-8b", "--gpu", "h900"], "--gpu 'h900' is not in the catalog"),
    (["--model", "llama-3.1-8b"], "--gpu is required"),
])
def test_bad_input_is_one_line_and_a_non_zero_exit(tmp_path, argv, message):
    png = tmp_path / "plot.png"
    r = run("plan", *argv, "--plot", str(png))
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}")
    assert "Traceback" not in r.output and r.stdout == ""
    assert not png.exists() and list(tmp_path.iterdir()) == []  # nothing half-written


def test_compare_writes_the_plot_and_the_crossover(tmp_path):
    png = tmp_path / "compare.png"
    r = run("plan", "--model", "kimi-linear-48b-a3b", "--gpu", "h200", "--compare", "--against", "qwen3-next-80b-a3b",
            "--against-tp", "2", "--plot", str(png), "--json")
    assert r.exit_code == 0, r.output
    cmp = json.loads(r.stdout)["compare"]
    assert cmp["crossover_context_len"] == 1885
    assert {row["model"] for row in cmp["records"]} == {"kimi-linear-48b-a3b", "kimi-linear-48b-a3b (all MLA)",
                                                        "qwen3-next-80b-a3b (tp 2)"}
    at_1m = {row["model"]: row for row in cmp["records"] if row["context_len"] == 2**20}
    # the all-MLA model stores 27 layers x 1152 B per token; the hybrid 7 layers plus one 43.4 MB slot
    assert at_1m["kimi-linear-48b-a3b (all MLA)"]["bytes_per_request"] == 2**20 * 27 * 1152
    assert at_1m["kimi-linear-48b-a3b"]["bytes_per_request"] == 2**20 * 7 * 1152 + 43_417_600
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["compare.png"]


def test_compare_of_a_non_hybrid_needs_a_second_model():
    r = run("plan", "--model", "llama-3.1-8b", "--gpu", "h200", "--compare")
    assert r.exit_code == 2 and "name a second model with --against" in r.stderr


def test_custom_gpu_from_flags():
    r = run("plan", "--model", "qwen3-8b", "--gpu-memory-gib", "96", "--gpu-bandwidth-tbs", "4", "--gpu-bf16-tflops",
            "500", "--mem-fraction-static", "0.9", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["gpu"] == "custom" and d["gpu_total_gib"] == 96


def test_models_and_gpus_list_the_catalogs():
    models = run("models")
    assert models.exit_code == 0
    assert "kimi-linear-48b-a3b" in models.stdout and "KimiLinearForCausalLM" in models.stdout
    gpus = run("gpus")
    assert gpus.exit_code == 0
    for name in ("h100", "h200", "b200", "a100-80gb", "a100-40gb", "l40s", "l4", "mi300x"):
        assert name in gpus.stdout
