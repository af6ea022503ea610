"""Issue #14: the hybrid-SWA pool pair, windows off the allowlist, and DeepSeek-V3.2's DSA pool.

Expected values are derived by hand from the configs and SGLANG_SWA_DSA.md (pool_configurator.py,
swa_memory_pool.py, memory_pool.py, index_key_cache.py of SGLang 0.5.23). Logged sizes are compared
the way SGLang prints them: f"{bytes / 2**30:.2f}".
"""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from poolsim.cli import app
from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.plan import SizingError, bytes_per_request, max_concurrency, plan_memory
from poolsim.pools.sizing.pool_configurator import pool_configurator
from poolsim.pools.sizing.server_args import ServerArgs

GIB = 2**30
H100, H200, B200 = get_gpu("h100"), get_gpu("h200"), get_gpu("b200")
MIMO = Path(__file__).with_name("data") / "XiaomiMiMo__MiMo-V2-Flash.PARTIAL.json"  # shared/hf_configs' copy
runner = CliRunner()


def gb(nbytes):
    return f"{nbytes / GIB:.2f}"


def plan(name, gpu=H100, **flags):
    return plan_memory(ModelConfig.load(name), gpu, ServerArgs(**flags))


# ---- hybrid SWA: two pools ----------------------------------------------------------------------


def test_gpt_oss_20b_layers_alternate_window_and_full():
    m = ModelConfig.load("gpt-oss-20b")
    assert m.swa_layer_ids == list(range(0, 24, 2)) and m.sliding_window == 128 and m.is_hybrid_swa


def test_gpt_oss_20b_split_with_logged_token_count():
    p = plan("gpt-oss-20b", max_total_tokens=100_000)
    # F_tok = S_tok = 8 kv heads x (64 + 64) x 2 B = 2,048; cell = 2,048 x 12 + 0.8 x 2,048 x 12
    assert p.cell_size_bytes == pytest.approx(24_576 + 19_660.8)
    # constrained path: full = the cap, swa = int(full x 0.8)
    assert (p.max_total_num_tokens, p.full_max_total_num_tokens, p.swa_max_total_num_tokens) == (
        100_000, 100_000, 80_000)
    # K per pool: (tokens + page) rows x 8 heads x 64 x 2 B x 12 layers
    assert gb(p.full_k_size_gib * GIB) == gb(100_001 * 8 * 64 * 2 * 12) == "1.14"
    assert gb(p.swa_k_size_gib * GIB) == gb(80_001 * 8 * 64 * 2 * 12) == "0.92"
    assert p.full_v_size_gib == p.full_k_size_gib and p.swa_v_size_gib == p.swa_k_size_gib
    assert f"{p.kv_cache_gib:.2f}" == gb(2 * (100_001 + 80_001) * 12_288) == "4.12"  # SWAKVPool mem usage
    assert p.full_attention_layer_ids == tuple(range(1, 24, 2))


def test_gpt_oss_20b_profiled_split_floors_by_the_float_cell():
    p = plan("gpt-oss-20b", page_size=64, attention_backend="triton")
    available = int((p.rest_gib) * GIB)
    full = int(available // 44_236.8) // 64 * 64
    assert p.full_max_total_num_tokens == full and p.swa_max_total_num_tokens == int(full * 0.8) // 64 * 64


def test_swa_pool_too_small_for_one_request_is_refused():
    # validate_swa_pool_size: window 128 + page 1 >= int(1,000 x 0.1) = 100
    with pytest.raises(SizingError, match=r"--swa-full-tokens-ratio 0.1: the SWA pool \(100 tokens\)"):
        plan("gpt-oss-20b", max_total_tokens=1_000, swa_full_tokens_ratio=0.1)
    with pytest.raises(SizingError, match=r"not in \(0, 1\]"):
        plan("gpt-oss-20b", swa_full_tokens_ratio=1.5)


def test_mimo_v2_flash_swa_geometry_differs_from_full():
    m = ModelConfig.load(MIMO)
    assert len(m.swa_layer_ids) == 39 and m.sliding_window == 128  # hybrid_layer_pattern: 39 ones of 48
    p = plan_memory(m, H200, ServerArgs(tp_size=8, max_total_tokens=200_000))
    # tp 8: full 4 kv heads -> 1 per rank, (192 + 128) x 2 B = 640; SWA 8 kv heads -> 1, 640 B
    assert (p.kv_head_num, p.swa_kv_head_num, p.swa_head_dim, p.swa_v_head_dim) == (1, 1, 192, 128)
    assert p.cell_size_bytes == pytest.approx(640 * 9 + 0.8 * 640 * 39)
    # tp 1: F_tok 4 x 320 x 2 = 2,560, S_tok 8 x 320 x 2 = 5,120
    tp1 = pool_configurator(m, 1, 1, "bfloat16")
    assert tp1.per_token() == (2_560, 5_120)
    assert tp1.cell_size() == pytest.approx(2_560 * 9 + 0.8 * 5_120 * 39) == 182_784


def test_swa_concurrency_counts_the_window_not_the_whole_request():
    p = plan("gpt-oss-20b", max_total_tokens=100_000)
    [c] = max_concurrency(p, [8192])
    assert c.kv_limit == min(100_000 // 8192, 80_000 // (128 + 1))
    # full layers hold 8,192 tokens, SWA layers the last 128 + the reserved page
    assert bytes_per_request(p, 8192) == (8192 * 2048 * 12 + 129 * 2048 * 12)


def test_run_simulates_hybrid_swa_models_on_both_pools(tmp_path):
    import json
    from pathlib import Path

    lines = (Path(__file__).parents[2] / "traces/data/default.jsonl").read_text().splitlines()[:4]
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    r = runner.invoke(app, ["run", str(trace), "--model", "gpt-oss-20b", "--gpu", "h100", "--max-total-tokens",
                            "100000", "--check", "--quiet", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    # --max-total-tokens caps the full pool; the SWA pool is int(100,000 x 0.8) (calculate_pool_sizes_from_max_tokens)
    assert summary["pools"]["kv"]["capacity"] == 100_000 and summary["pools"]["swa"]["capacity"] == 80_000
    assert summary["finished"] == 4


def test_run_refuses_hybrid_swa_without_the_radix_cache():
    r = runner.invoke(app, ["run", "--model", "gpt-oss-20b", "--gpu", "h100", "--max-total-tokens", "100000",
                            "--disable-radix-cache"])
    assert r.exit_code == 2 and "radix cache on only" in r.output


def test_plan_json_reports_both_pools_and_compare_shows_all_full():
    r = runner.invoke(app, ["plan", "--model", "gpt-oss-20b", "--gpu", "h100", "--max-total-tokens", "100000",
                            "--json", "--compare"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert (d["full_max_total_num_tokens"], d["swa_max_total_num_tokens"], d["swa_full_tokens_ratio"]) == (
        100_000, 80_000, 0.8)
    assert f"{d['swa_k_size_gib']:.2f}" == f"{d['swa_v_size_gib']:.2f}" == "0.92" and d["swa_pool"] == "hybrid"
    models = {rec["model"] for rec in d["compare"]["records"]}
    assert models == {"gpt-oss-20b", "gpt-oss-20b (all full attention)"}
    full = next(rec for rec in d["compare"]["records"]
                if rec["model"].endswith("(all full attention)") and rec["context_len"] == 8192)
    assert full["bytes_per_request"] == 8192 * 2048 * 24  # every layer holds every token


# ---- windows off the allowlist: one pool, every layer full ---------------------------------------


def test_gemma_3_keeps_one_pool_with_every_layer_full():
    m = ModelConfig.load("gemma-3-27b")
    assert m.full_attention_layer_ids == list(range(62)) and not m.is_hybrid_swa
    assert [i for i in range(62) if i not in m.swa_layer_ids] == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]
    p = plan("gemma-3-27b", H200, max_total_tokens=100_000, context_length=131072)
    assert p.cell_size_bytes == 16 * (128 + 128) * 2 * 62 == 507_904  # all 62 layers sized as full
    assert p.swa_pool == "all-full" and p.full_max_total_num_tokens is None
    assert "not used for sizing" in p.table()


def test_mistral_style_uniform_window_is_one_ordinary_pool():
    cfg = json.loads(open(ModelConfig.load("llama-3.1-8b").source).read())
    cfg.update(architectures=["MistralForCausalLM"], sliding_window=4096)
    m = ModelConfig.from_dict(cfg, name="mistral-like")
    assert m.sliding_window == 4096 and not m.is_hybrid_swa
    p = plan_memory(m, H100, ServerArgs(max_total_tokens=10_000))
    assert p.cell_size_bytes == 8 * 256 * 2 * 32 and p.swa_pool == "all-full"


# ---- DeepSeek-V3.2: MLA latent + index-K cache ---------------------------------------------------


def test_dsa_cell_per_gpu_and_kv_dtype():
    # Hopper default bf16, raw 576 latent: 576 x 2 + index 128 + 128/128 x 4 = 1,284 B per layer
    p = plan("deepseek-v3.2", H200, tp_size=8, max_total_tokens=100_000)
    assert (p.kv_cache_dtype, p.attention_backend, p.page_size) == ("bfloat16", "dsa", 64)
    assert p.cell_size_bytes == (576 * 2 + 132) * 61 == 78_324
    # Hopper FP8 on flashmla_kv: the scaled layout 512 + 16 + 64 x 2 = 656 B
    fp8 = plan("deepseek-v3.2", H200, tp_size=8, max_total_tokens=100_000, kv_cache_dtype="fp8_e4m3")
    assert fp8.cell_size_bytes == (656 + 132) * 61 == 48_068 and fp8.latent_row_bytes == 656
    # Blackwell: auto is fp8_e4m3 on trtllm, the raw 576-byte layout
    b = plan("deepseek-v3.2", B200, tp_size=8, max_total_tokens=100_000)
    assert (b.kv_cache_dtype, b.cell_size_bytes) == ("fp8_e4m3", (576 + 132) * 61) == ("fp8_e4m3", 43_188)


def test_dsa_logged_kv_size_includes_the_index_cache():
    p = plan("deepseek-v3.2", H200, tp_size=8, max_total_tokens=100_000, page_size=1)
    assert p.page_size == 64 and p.max_total_num_tokens == 99_968  # page 64 forced, floored
    latent = (99_968 + 64) * 576 * 2 * 61  # (size + page) rows per layer
    pages = (99_968 + 64 + 1) // 64  # IndexKeyCache: 1,563 pages of 64 x 132 B per layer
    index = pages * 64 * 132 * 61
    assert pages == 1_563 and gb(p.index_k_size_gib * GIB) == gb(index) == "0.75"
    assert gb(p.kv_size_gib * GIB) == gb(latent + index) == "7.30"


def test_dsa_refuses_other_kv_dtypes():
    with pytest.raises(SizingError, match="DeepSeek DSA supports only bfloat16 or fp8_e4m3"):
        plan("deepseek-v3.2", H200, tp_size=8, kv_cache_dtype="fp8_e5m2")


def test_plan_json_reports_the_index_cache():
    r = runner.invoke(app, ["plan", "--model", "deepseek-v3.2", "--gpu", "h200", "--tp", "8",
                            "--max-total-tokens", "100000", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert f"{d['kv_size_gib']:.2f}" == "7.30" and f"{d['index_k_size_gib']:.2f}" == "0.75"
    assert d["index_head_dim"] == 128 and d["latent_row_bytes"] == 1152
