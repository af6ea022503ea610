"""SGLang 0.5.23's sizing, checked against numbers worked out by hand from docs/sglang.md and the sources.

Logged sizes are compared the way SGLang prints them: f"{bytes / 2**30:.2f}" ("GB" in its logs is GiB).
"""

from dataclasses import replace

import pytest

from poolsim.pools.hardware.gpu_catalog import GPUSpec, get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.plan import (
    SizingError,
    bytes_per_request,
    crossover_context_len,
    default_chunked_prefill_size,
    default_mem_fraction_static,
    mamba_cache_params,
    max_concurrency,
    plan_memory,
    resolve_mamba_strategy,
    resolve_max_num_reqs,
    split_mamba_budget,
)
from poolsim.pools.sizing.server_args import ServerArgs

GIB = 2**30
H100, H200, B200, L4 = get_gpu("h100"), get_gpu("h200"), get_gpu("b200"), get_gpu("l4")
BIG = GPUSpec.custom("test 192GiB", memory_gib=192)  # sm90, room for the SPEC 7.4 budget


def gb(nbytes):
    return f"{nbytes / GIB:.2f}"


def plan(name, gpu=H200, **flags):
    return plan_memory(ModelConfig.load(name), gpu, ServerArgs(**flags))


# ---- logged KV sizes --------------------------------------------------------------------------


def test_llama_3_1_8b_reproduces_the_logged_k_and_v_sizes():
    # "KV Cache is allocated. #tokens: 442750, K size: 27.02 GB, V size: 27.02 GB"
    p = plan("llama-3.1-8b", max_total_tokens=442750)
    rows = 442750 + 1  # size + page_size
    k_bytes = rows * 8 * 128 * 32 * 2  # rows x kv heads x head_dim x layers x bf16
    assert k_bytes == 29_016_129_536
    assert p.max_total_num_tokens == 442750
    assert p.cell_size_bytes == 8 * (128 + 128) * 32 * 2 == 131072
    assert gb(p.k_size_gib * GIB) == gb(p.v_size_gib * GIB) == "27.02" == gb(k_bytes)
    assert p.k_size_gib * GIB == k_bytes and p.kv_size_gib is None


def test_gqa_with_tp_above_the_kv_heads_keeps_one_head_per_rank():
    p = plan("llama-3.1-70b", tp_size=16, max_total_tokens=1_000_000)
    assert p.kv_head_num == max(1, 8 // 16) == 1
    assert p.cell_size_bytes == 1 * (128 + 128) * 80 * 2 == 40960
    k_bytes = (1_000_000 + 1) * 1 * 128 * 80 * 2
    assert p.k_size_gib * GIB == k_bytes == 20_480_020_480 and gb(k_bytes) == "19.07"


def test_deepseek_v3_mla_bf16_and_fp8_kv_are_not_sharded_by_tp():
    bf16 = plan("deepseek-v3", tp_size=8, max_total_tokens=524288)
    fp8 = plan("deepseek-v3", tp_size=8, max_total_tokens=524288, kv_cache_dtype="fp8_e4m3")
    assert bf16.cell_size_bytes == (512 + 64) * 61 * 2 == 70272  # every rank stores the full latent
    assert fp8.cell_size_bytes == (512 + 64) * 61 * 1 == 35136
    assert bf16.kv_size_gib * GIB == 524289 * 70272 == 36_842_836_608 and gb(36_842_836_608) == "34.31"
    assert fp8.kv_size_gib * GIB == 524289 * 35136 == 18_421_418_304 and gb(18_421_418_304) == "17.16"
    assert bf16.k_size_gib is None and fp8.kv_cache_dtype == "fp8_e4m3"


def test_deepseek_v3_on_b200_gets_trtllm_mla_and_64_token_pages():
    p = plan("deepseek-v3", gpu=B200, tp_size=8, max_total_tokens=524288, kv_cache_dtype="fp8_e4m3")
    assert (p.attention_backend, p.page_size) == ("trtllm_mla", 64)
    assert p.kv_size_gib * GIB == (524288 + 64) * 35136 == 18_423_631_872


def test_page_size_pads_64_rows_and_floors_tokens_to_pages():
    p = plan("llama-3.1-8b", page_size=16, max_total_tokens=1000)
    assert p.max_total_num_tokens == 1000 // 16 * 16 == 992
    assert p.k_size_gib * GIB == (992 + 16) * 8 * 128 * 32 * 2 == 66_060_288
    profiled = plan("llama-3.1-8b", page_size=16)
    assert profiled.max_total_num_tokens % 16 == 0


def test_hybrid_cell_size_counts_full_attention_layers_only():
    kimi = plan("kimi-linear-48b-a3b", max_total_tokens=100_000)
    assert kimi.cell_size_bytes == (512 + 64) * 7 * 2 == 8064  # 7 MLA layers of 27
    assert kimi.kv_size_gib * GIB == 100_001 * 8064
    qwen = plan("qwen3-next-80b-a3b", tp_size=2, max_total_tokens=100_000)
    assert qwen.cell_size_bytes == 1 * (256 + 256) * 12 * 2 == 12288  # 2 kv heads / tp 2, 12 of 48 layers
    nemo = plan("nemotron-3-nano-30b-a3b", max_total_tokens=100_000)
    assert nemo.cell_size_bytes == 2 * (128 + 128) * 6 * 2 == 6144  # 6 '*' layers of 52


# ---- state slots --------------------------------------------------------------------------------


def test_kda_state_per_slot_is_43_417_600_bytes_at_tp1():
    kimi = ModelConfig.load("kimi-linear-48b-a3b")
    conv = (4 - 1) * (32 * 128 * 3) * 2  # (K-1, q+k+v channels) bf16 = 73,728 B per layer
    ssm = 32 * 128 * 128 * 4  # (H, D, D) fp32 = 2,097,152 B per layer
    assert 20 * (conv + ssm) == 43_417_600
    assert mamba_cache_params(kimi, 1, None).mamba_cache_per_req == 43_417_600
    assert mamba_cache_params(kimi, 2, None).mamba_cache_per_req == 43_417_600 // 2
    assert mamba_cache_params(kimi, 1, "bfloat16").mamba_cache_per_req == 20 * (conv + ssm // 2) == 22_446_080


def test_gdn_and_mamba2_state_per_slot_by_hand():
    qwen = ModelConfig.load("qwen3-next-80b-a3b")
    conv_dim = 32 * 128 + 2 * 16 * 128  # value_dim + 2 * n_groups(16 key heads) * key_head_dim = 8192
    per_layer = conv_dim * 3 * 2 + 32 * 128 * 128 * 4  # conv (8192, K-1) bf16 + temporal (32, 128, 128) fp32
    assert mamba_cache_params(qwen, 1, None).mamba_cache_per_req == 36 * per_layer == 77_266_944
    nemo = ModelConfig.load("nemotron-3-nano-30b-a3b")
    conv_dim = 64 * 64 + 2 * 8 * 128  # 6144
    per_layer = conv_dim * 3 * 2 + 64 * 64 * 128 * 4
    assert mamba_cache_params(nemo, 1, None).mamba_cache_per_req == 23 * per_layer == 49_082_368


def test_spec_7_4_worked_example_rest_60_gib():
    # rest = 60 "GB"; SGLang's GB is GiB: get_available_gpu_memory returns bytes / (1 << 30)
    slots, rest_kv = split_mamba_budget(60.0, 43_417_600, 0.9)
    # budget 60 * 0.9 / 1.9 = 28.42 GiB = 30,517,... B; floor(budget / slot) - 1 = 702 - 1
    assert slots == 701
    assert f"{60 - rest_kv:.2f}" == "28.39"  # 702 slots incl. padding x 43,417,600 B
    kv_bytes = 60 * GIB - 702 * 43_417_600  # 33,945,354,240 B
    assert int(rest_kv * GIB) == kv_bytes and f"{rest_kv:.2f}" == "31.61"
    tokens = kv_bytes // 8064
    assert tokens == 4_209_493  # 4.21 M MLA tokens
    # est = int(4,209,493 / 1,048,576 * 512) = 2055 rows; the mamba cap 701 // 5 = 140 binds
    assert resolve_max_num_reqs(tokens, 1_048_576, None, slots, 5) == (140, True)
    # reading rest as decimal GB would give fewer slots: 60e9 * 0.9/1.9 / 43,417,600 = 654.6 -> 653
    assert split_mamba_budget(60e9 / GIB, 43_417_600, 0.9)[0] == 653


def test_kimi_linear_plan_reproduces_logged_mamba_and_kv_sizes():
    p = plan("kimi-linear-48b-a3b", gpu=BIG, mem_fraction_static=0.95, max_mamba_cache_size=701,
             max_total_tokens=4_209_493)
    assert p.max_mamba_cache_size == 701 and p.mamba_bytes_per_slot == 43_417_600
    # "Mamba Cache is allocated. max_mamba_cache_size: 701, conv_state size: 0.96GB, ssm_state size: 27.42GB"
    assert p.conv_state_gib * GIB == 702 * 20 * (3 * 12288) * 2 == 1_035_141_120 and gb(1_035_141_120) == "0.96"
    assert p.ssm_state_gib * GIB == 702 * 20 * 32 * 128 * 128 * 4 == 29_444_014_080 and gb(29_444_014_080) == "27.42"
    # "KV Cache is allocated. #tokens: 4209493, KV size: 31.61 GB"
    assert p.kv_size_gib * GIB == 4_209_494 * 8064 == 33_945_359_616 and gb(33_945_359_616) == "31.61"
    assert (p.max_running_requests, p.rows_capped_by_mamba, p.mamba_ratio) == (140, True, 5)
    assert (p.mamba_strategy, p.overlap_forced_off) == ("extra_buffer", False)


# ---- request rows --------------------------------------------------------------------------------


@pytest.mark.parametrize("capacity, context_len, user, expected", [
    (100_000, 131072, None, 2048),  # est int(100000/131072*512) = 390, clamped up to 2048
    (10_000_000, 131072, None, 4096),  # est 39062, clamped down to 4096
    (3000, 131072, None, 1500),  # token_capacity // 2
    (100_000, 32768, None, 2048),  # est 1562 -> 2048
    (1_000_000, 131072, 64, 64),  # --max-running-requests
    (1000, 131072, 4096, 500),  # ... still at most token_capacity // 2
])
def test_resolve_max_num_reqs(capacity, context_len, user, expected):
    assert resolve_max_num_reqs(capacity, context_len, user) == (expected, False)


def test_mamba_cap_that_leaves_no_rows_is_refused():
    with pytest.raises(SizingError, match=r"max_mamba_cache_size 4 // mamba_ratio 5 leaves no request rows"):
        resolve_max_num_reqs(1_000_000, 131072, None, 4, 5)


def test_req_to_token_table_is_outside_the_kv_budget():
    p = plan("llama-3.1-8b", max_running_requests=100, context_length=8192)
    assert p.req_to_token_rows == p.max_running_requests == 100
    assert p.max_context_len == 8192 + 4
    assert p.req_to_token_gib * GIB == (100 + 1) * (8192 + 4) * 4 == 3_311_184
    # the pools use the budget; the table comes out of what (1 - mem_fraction_static) left
    assert p.free_after_pools_gib == pytest.approx(p.available_after_weights_gib - p.kv_cache_gib)
    # the padding page (size + page_size rows) is not in the budget, so it comes out of the headroom too
    assert p.free_after_pools_gib * GIB >= p.non_static_headroom_gib * GIB - p.page_size * p.cell_size_bytes


def test_a_req_to_token_table_larger_than_the_free_memory_is_an_error():
    # 40000 rows x (131072 + 4) int32 = 19.53 GiB > the ~13.3 GiB H100 headroom
    with pytest.raises(SizingError, match=r"^--context-length 131072: the req_to_token table \(40001 rows x 131076 "
                                          r"int32 = 19\.53 GiB\) exceeds"):
        plan("llama-3.1-8b", gpu=H100, max_running_requests=40000)


# ---- defaults SGLang picks -------------------------------------------------------------------------


def test_default_mem_fraction_static_by_hand():
    llama, args = ModelConfig.load("llama-3.1-8b"), ServerArgs()
    # 512 + 8192*1.5 + 1/8*1024 + 256 decode graphs*2 + 58 prefill graph sizes*8 = 13,904 MiB (> the 10 GiB floor)
    assert len([s for s in range(4, 8193) if s in range(4, 33, 4) or s in range(48, 257, 16) or s in range(288, 513, 32)
                or s in range(576, 1025, 64) or s in range(1280, 4097, 256) or s in range(4608, 8193, 512)]) == 58
    assert default_mem_fraction_static(llama, H100, args, 8192) == round((81559 - 13904) / 81559, 3) == 0.83
    # MLA at tp 8: 512 + 12288 + 1024 + 512*2 + 1536 (MLA prefill graphs) = 16,384 MiB
    ds = ModelConfig.load("deepseek-v3")
    assert default_mem_fraction_static(ds, H200, ServerArgs(tp_size=8), 8192) == round(127387 / 143771, 3) == 0.886
    # KDA turns prefill graphs off: 512 + 12288 + 128 + 512 = 13,440 MiB
    kimi = ModelConfig.load("kimi-linear-48b-a3b")
    assert default_mem_fraction_static(kimi, H200, args, 8192) == round(130331 / 143771, 3) == 0.907
    # L4 (< 60 GiB, no floor): 512 + 4096*1.5 + 128 + 48*2 + 50 prefill sizes*8 = 7,280 MiB
    assert default_mem_fraction_static(ModelConfig.load("qwen3-8b"), L4, args, 4096) == 0.684


def test_default_chunked_prefill_size_by_gpu_memory():
    sizes = {name: default_chunked_prefill_size(get_gpu(name)) for name in ("l4", "a100-40gb", "l40s", "h100",
                                                                         "a100-80gb", "h200", "b200", "mi300x")}
    assert sizes == {"l4": 4096, "a100-40gb": 4096, "l40s": 4096, "h100": 8192, "a100-80gb": 8192, "h200": 8192,
                     "b200": 16384, "mi300x": 16384}


def test_mi300x_aiter_scales_mem_fraction_for_long_contexts():
    p = plan("llama-3.1-8b", gpu=get_gpu("mi300x"))
    # 512 + 16384*1.5 + 128 + 512*2 (no prefill graphs off CUDA) = 26,240 MiB -> 0.867; x0.85 for context > 8192
    assert p.attention_backend == "aiter"
    assert p.mem_fraction_static == pytest.approx(0.867 * 0.85)
    assert plan("llama-3.1-8b", gpu=get_gpu("mi300x"), context_length=8192).mem_fraction_static == 0.867


def test_qwen3_next_on_b200_follows_the_model_override():
    p = plan("qwen3-next-80b-a3b", gpu=B200, tp_size=2, max_total_tokens=100_000)
    assert (p.attention_backend, p.page_size, p.mamba_strategy) == ("trtllm_mha", 64, "extra_buffer")
    nb = plan("qwen3-next-80b-a3b", gpu=B200, tp_size=2, max_total_tokens=100_000, disable_overlap_schedule=True)
    assert (nb.attention_backend, nb.page_size, nb.mamba_strategy, nb.mamba_ratio) == ("triton", 1, "no_buffer", 3)


def test_mamba_strategy_resolution_and_ratio():
    kimi = ModelConfig.load("kimi-linear-48b-a3b")
    assert resolve_mamba_strategy(kimi, H200, ServerArgs()) == ("extra_buffer", False, False)
    p = plan("kimi-linear-48b-a3b", max_total_tokens=100_000)
    assert p.mamba_ratio == 3 + 2  # two ping-pong tracking slots with the overlap scheduler
    lazy_paged = plan("kimi-linear-48b-a3b", max_total_tokens=100_000, disable_overlap_schedule=True, page_size=64)
    assert (lazy_paged.mamba_strategy, lazy_paged.mamba_ratio) == ("extra_buffer", 4)  # one tracking slot
    no_buf = plan("kimi-linear-48b-a3b", max_total_tokens=100_000, disable_overlap_schedule=True)
    assert (no_buf.mamba_strategy, no_buf.mamba_ratio) == ("no_buffer", 3)
    off = plan("kimi-linear-48b-a3b", max_total_tokens=100_000, disable_radix_cache=True)
    assert (off.mamba_strategy, off.mamba_ratio) == ("off", 1)
    # an architecture without extra-buffer support resolves to no_buffer and loses the overlap scheduler
    other = replace(kimi, architecture="SomeHybridForCausalLM")
    assert resolve_mamba_strategy(other, H200, ServerArgs()) == ("no_buffer", True, True)


def test_disabled_radix_cache_sizes_the_mamba_pool_from_max_running_requests():
    p = plan("kimi-linear-48b-a3b", disable_radix_cache=True, max_running_requests=64, max_total_tokens=100_000)
    assert p.max_mamba_cache_size == 64 and p.max_running_requests == 64 // 1


# ---- capacity -----------------------------------------------------------------------------------------


def test_concurrency_reports_which_pool_binds_first():
    kimi = plan("kimi-linear-48b-a3b", gpu=BIG, mem_fraction_static=0.95, max_mamba_cache_size=701,
                max_total_tokens=4_209_493)
    short, long_ = max_concurrency(kimi, [1024, 131072])
    assert (short.max_concurrency, short.binding) == (140, "mamba_slots")  # 4,209,493 // 1024 = 4110 KV-wise
    assert (long_.max_concurrency, long_.kv_limit, long_.binding) == (32, 4_209_493 // 131072, "kv_tokens")
    llama = plan("llama-3.1-8b", max_running_requests=64, max_total_tokens=500_000)
    rows, kv, too_long = max_concurrency(llama, [1024, 65536, 200_000])
    assert (rows.max_concurrency, rows.binding) == (64, "request_rows")  # 500,000 // 1024 = 488 KV-wise
    assert (kv.max_concurrency, kv.binding) == (500_000 // 65536, "kv_tokens") == (7, "kv_tokens")
    assert (too_long.max_concurrency, too_long.binding) == (0, "context_len")


def test_bytes_per_request_and_the_kda_crossover():
    kimi = ModelConfig.load("kimi-linear-48b-a3b")
    # replacing 20 KDA layers by MLA adds 20 * 576 * 2 = 23,040 B per token; 43,417,600 / 23,040 = 1884.4
    assert crossover_context_len(kimi, ServerArgs()) == 1885
    assert crossover_context_len(kimi, ServerArgs(), slots=5) == 9423  # 5 * 43,417,600 / 23,040 = 9422.2
    p = plan("kimi-linear-48b-a3b", max_total_tokens=100_000)
    assert bytes_per_request(p, 1000) == 1000 * 8064 + 43_417_600


# ---- bad input ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, gpu, flags, message", [
    ("llama-3.1-8b", H200, dict(page_size=3), r"^--page-size 3 is not a power of two$"),
    ("llama-3.1-8b", H200, dict(tp_size=3), r"^--tp 3 does not divide num_attention_heads 32$"),
    ("llama-3.1-70b", H200, dict(tp_size=12), r"^--tp 12 does not divide num_attention_heads 64$"),
    ("llama-3.1-70b", L4, dict(), r"^--tp 1: llama-3.1-70b weights need 131\.42 GiB per rank, more than the "
                                  r"21\.27 GiB"),
    ("qwen3-8b", L4, dict(), r"^--mem-fraction-static 0\.684: weights \(15\.26 GiB per rank\) leave no KV memory on "
                             r"L4 24GB; raise it above 0\.718$"),
    ("llama-3.1-8b", H200, dict(context_length=200_000), r"^--context-length 200000 exceeds the model's derived "
                                                         r"context length 131072"),
    ("deepseek-v3", H200, dict(tp_size=32), r"^--tp 32: intermediate_size 18432 / tp = 576 is not divisible by the "
                                            r"fp8 weight block 128$"),
    ("kimi-linear-48b-a3b", H200, dict(mamba_radix_cache_strategy="no_buffer"),
     r"^--mamba-radix-cache-strategy no_buffer needs --disable-overlap-schedule$"),
    ("llama-3.1-8b", H200, dict(kv_cache_dtype="int4"), r"^--kv-cache-dtype 'int4' is not one of"),
])
def test_impossible_configs_raise_one_line_naming_the_parameter(name, gpu, flags, message):
    with pytest.raises(SizingError, match=message) as e:
        plan(name, gpu=gpu, **flags)
    assert "\n" not in str(e.value)


def test_plan_json_nests_the_mamba_fields_for_hybrids_only():
    hybrid = plan("kimi-linear-48b-a3b", max_total_tokens=100_000).to_dict()
    assert set(hybrid["mamba"]) >= {"max_mamba_cache_size", "bytes_per_slot", "conv_state_gib", "ssm_state_gib"}
    assert hybrid["mamba"]["bytes_per_slot"] == 43_417_600
    assert plan("llama-3.1-8b", max_total_tokens=1000).to_dict()["mamba"] is None


def test_plan_builds_the_simulators_pools():
    p = plan("kimi-linear-48b-a3b", max_total_tokens=100_000)
    pool = p.make_kv_pool()
    assert pool.full_layer_nums == 7 and pool.size == 100_000 and pool.cell_size_bytes() == p.cell_size_bytes
    params = p.mamba_cache_params()
    assert params.mamba_cache_per_req == p.mamba_bytes_per_slot and params.layers == list(p.linear_layer_ids)
    mha = plan("llama-3.1-70b", tp_size=16, max_total_tokens=1000).make_kv_pool()
    assert (mha.head_num, mha.layer_num, mha.get_kv_size_bytes()[0]) == (1, 80, 1001 * 128 * 80 * 2)
