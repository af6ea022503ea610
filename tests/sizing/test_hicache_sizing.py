"""HiCache host pools sized as SGLang 0.5.23 sizes them (pool_host/base.py:212-257, pool_host/{mha,mla,mamba}.py),
every expected value derived by hand in the comment beside it."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from poolsim.cli import app
from poolsim.pools.errors import SizingError
from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.mem_cache.pool.mha import MHATokenToKVPool
from poolsim.pools.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.plan import plan_memory
from poolsim.pools.sizing.server_args import ServerArgs


def _plan(model, gpu, **kw):
    return plan_memory(ModelConfig.load(model), get_gpu(gpu), ServerArgs(enable_hierarchical_cache=True, **kw))


def test_mha_page1_ratio():
    # Llama-3.1-8B: 8 KV heads x (128 + 128) x 32 layers x 2 B = 131,072 B a token.
    # size = int(100,000 x 2) = 200,000; page_num = 200,000 // 1 + 1 = 200,001 -> 200,001 slots.
    h = _plan("llama-3.1-8b", "H100", max_total_tokens=100_000, hicache_ratio=2.0).hicache
    assert (h.size_per_token, h.host_tokens, h.device_tokens) == (131_072, 200_001, 100_000)
    assert h.host_bytes == 200_001 * 131_072 == 26_214_531_072
    assert h.mamba_host_states is None


def test_mha_page64_ratio():
    # size = int(128,000 x 2) = 256,000; page_num = 256,000 // 64 + 1 = 4,001 -> 4,001 x 64 = 256,064 slots.
    h = _plan("llama-3.1-8b", "H100", max_total_tokens=128_000, page_size=64, hicache_ratio=2.0).hicache
    assert (h.host_tokens, h.host_bytes, h.page_size) == (256_064, 256_064 * 131_072, 64)


def test_mha_hicache_size_overrides_ratio():
    # size = int(10e9 // 131,072) = 76,293 (76,293.9); page 1: 76,294; page 64: 76,293 // 64 = 1,192, +1 -> 76,352.
    assert _plan("llama-3.1-8b", "H100", max_total_tokens=100_000, hicache_ratio=3.0,
                 hicache_size=10).hicache.host_tokens == 76_294
    assert _plan("llama-3.1-8b", "H100", max_total_tokens=128_000, page_size=64,
                 hicache_size=10).hicache.host_tokens == 76_352


def test_mla_page1_and_page64():
    # DeepSeek-V3: MLA (512 + 64) x 61 layers x 2 B = 70,272 B a token, on every tp rank.
    # ratio 3: int(200,000 x 3) = 600,000 + 1 = 600,001 slots.
    h = _plan("deepseek-v3", "H200", tp_size=8, max_total_tokens=200_000, hicache_ratio=3.0).hicache
    assert (h.size_per_token, h.host_tokens, h.host_bytes) == (70_272, 600_001, 600_001 * 70_272)
    # --hicache-size 20: int(20e9 // 70,272) = 284,608; // 64 = 4,447, +1 = 4,448 pages -> 284,672 slots.
    h = _plan("deepseek-v3", "H200", tp_size=8, max_total_tokens=200_000, page_size=64, hicache_size=20).hicache
    assert (h.host_tokens, h.ranks_per_host) == (284_672, 8)
    # 8 ranks on a DGX H200 (2 TB): (2048 GiB - 10 GiB) // 8 = 273,535,729,664 B each
    assert h.budget_bytes == (2048 - 10) * 2**30 // 8 == 273_535_729_664


def test_hybrid_kv_and_mamba_host_pools_page1():
    # Kimi-Linear: MLA (512 + 64) x 7 full layers x 2 B = 8,064 B; KV host int(128,000 x 2) + 1 = 256,001.
    # Mamba host: int(100 x 2) + 1 = 201 states x 43,417,600 B (docs/sglang.md 7.3: one KDA slot at tp 1).
    h = _plan("kimi-linear-48b-a3b", "H200", max_total_tokens=128_000, max_mamba_cache_size=100,
              hicache_ratio=2.0).hicache
    assert (h.size_per_token, h.host_tokens) == (8_064, 256_001)
    assert (h.mamba_host_states, h.mamba_size_per_state) == (201, 43_417_600)
    assert h.mamba_host_bytes == 201 * 43_417_600 == 8_726_937_600


def test_hybrid_hicache_size_split_by_device_bytes_page64():
    # _split_hicache_size: KV device bytes (128,000 + 64 rows) x 8,064 = 1,032,708,096; mamba (100 + 1) x
    # 43,417,600 = 4,385,177,600. KV share 50 x 1,032,708,096 / 5,417,885,696 = 9.5305 GB:
    # int(9.5305e9 // 8,064) = 1,181,863; // 64 = 18,466, +1 = 18,467 pages = 1,181,888 slots.
    # Mamba share 40.4695 GB // 43,417,600 = 932, +1 = 933 states.
    h = _plan("kimi-linear-48b-a3b", "H200", max_total_tokens=128_000, page_size=64, max_mamba_cache_size=100,
              hicache_size=50).hicache
    assert (h.host_tokens, h.mamba_host_states) == (1_181_888, 933)


def test_auto_sizing_reduces_the_default_ratio_to_the_host_budget():
    # Neither ratio nor size: fraction 0.8. RAM 30 GiB, 1 rank: budget (30 - 10) GiB = 21,474,836,480 B,
    # x 0.8 = 17,179,869,184. Device KV bytes: 32 layers x 2 x (100,000 + 1) rows x 8 x 128 x 2 B = 13,107,331,072.
    # ratio = min(2, 17,179,869,184 x 0.95 / 13,107,331,072) = 1.24517...; int(100,000 x that) = 124,517, +1.
    h = _plan("llama-3.1-8b", "H100", max_total_tokens=100_000, host_memory_gib=30).hicache
    assert h.ratio_source == "auto-sized" and h.hicache_ratio == pytest.approx(17_179_869_184 * 0.95 / 13_107_331_072)
    assert (h.host_tokens, h.auto_size_budget_bytes) == (124_518, 17_179_869_184)
    # with enough RAM the default ratio 2.0 stands
    h = _plan("llama-3.1-8b", "H100", max_total_tokens=100_000).hicache
    assert (h.hicache_ratio, h.ratio_source, h.host_tokens) == (2.0, "default", 200_001)


def test_refused_when_host_memory_is_short_and_warned_when_not_larger():
    # 200,001 x 131,072 = 26.21 GB requested; RAM 20 GiB leaves (20 - 10) GiB = 10.74 GB
    with pytest.raises(SizingError, match=r"Requesting 26.21 GB but only have 10.74 GB free"):
        _plan("llama-3.1-8b", "H100", max_total_tokens=100_000, hicache_ratio=2.0, host_memory_gib=20)
    # ratio 0.5: int(50,000) + 1 = 50,001 <= 100,000 device tokens: SGLang's warning
    p = _plan("llama-3.1-8b", "H100", max_total_tokens=100_000, hicache_ratio=0.5)
    assert p.hicache.host_tokens == 50_001
    assert any("host pool (50001 tokens) is smaller than the device pool (100000 tokens)" in w for w in p.warnings)
    # ratio 1: 100,000 + one padding page = 100,001 > 100,000: no warning
    assert not any("host pool" in w for w in _plan("llama-3.1-8b", "H100", max_total_tokens=100_000,
                                                    hicache_ratio=1.0).warnings)


def test_flag_resolution_as_sglang():
    with pytest.raises(SizingError, match="mutually exclusive"):
        _plan("llama-3.1-8b", "H100", disable_radix_cache=True)
    with pytest.raises(SizingError, match="requires a storage backend"):
        _plan("llama-3.1-8b", "H100", hicache_host_memory_mode="buffer_only")
    h = _plan("llama-3.1-8b", "H100", max_total_tokens=100_000, hicache_host_memory_mode="buffer_only",
              hicache_storage_backend="file", hicache_write_policy="write_back", hicache_size=0,
              hicache_host_memory_fraction=None).hicache
    assert (h.write_policy, h.hicache_ratio, h.host_tokens) == ("write_through", 1.2, 120_001)  # 1.2 in buffer_only
    h = _plan("llama-3.1-8b", "H100", hicache_mem_layout="page_first_direct", hicache_ratio=2.0).hicache
    assert (h.mem_layout, h.io_backend) == ("page_first_direct", "direct")
    h = _plan("llama-3.1-8b", "H100", hicache_io_backend="direct", hicache_ratio=2.0).hicache
    assert h.mem_layout == "page_first_direct"
    with pytest.raises(SizingError, match="mamba host pool supports only"):
        _plan("kimi-linear-48b-a3b", "H200", hicache_mem_layout="layer_first", hicache_ratio=2.0)
    assert _plan("llama-3.1-8b", "H100").hicache is not None
    assert plan_memory(ModelConfig.load("llama-3.1-8b"), get_gpu("H100"), ServerArgs()).hicache is None


def test_host_allocator_order_and_the_allocatable_padding_page():
    # a 128-token device pool at ratio 2 has 257 host slots, slot 0 included (SGLANG_HICACHE.md)
    host = MHATokenToKVPoolHost(MHATokenToKVPool(128, 1, "bfloat16", 1, 64, 2), 2.0, 0, 1)
    assert host.size == 257 and host.available_size() == 257
    a = host.alloc(4)
    assert a.tolist() == [0, 1, 2, 3]
    b = host.alloc(250)
    host.free(a)
    assert host.available_size() == 7  # 3 never used + 4 released
    assert host.alloc(3).tolist() == [254, 255, 256]  # free slots first, releases only when short
    assert host.alloc(2).tolist() == [0, 1] and host.alloc(3) is None
    host.free(b[:1])
    assert np.array_equal(host.alloc(3), [2, 3, 4])


def test_plan_cli_prints_the_host_pool_and_json_has_hicache():
    runner = CliRunner()
    out = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--max-total-tokens", "100000",
                              "--enable-hicache", "--hicache-ratio", "2", "--json"])
    assert out.exit_code == 0, out.output
    h = json.loads(out.stdout)["hicache"]
    assert (h["host_tokens"], h["host_bytes"], h["size_per_token"]) == (200_001, 26_214_531_072, 131_072)
    off = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--json"])
    assert json.loads(off.stdout)["hicache"] is None
    text = runner.invoke(app, ["plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--max-total-tokens", "100000",
                               "--enable-hierarchical-cache", "--hicache-ratio", "2"]).stdout
    assert "HiCache host pool           200,001 tokens x 131,072 B = 26.21 GB per rank" in text
