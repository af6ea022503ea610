"""HiCache's transfer time: the layer-wise load-back overlap and the blocking write-back, by hand."""

import pytest

from poolsim.pools.hardware.gpu_catalog import GPU_CATALOG, get_gpu
from poolsim.pools.mem_cache.hiradix_cache import HiCacheController
from poolsim.sim.step_time import HOST_LINK_EFFICIENCY, FixedStepTime, HiCacheStepTime


class _Tree:
    def __init__(self, ctrl):
        self.hicache = ctrl


class _Batch:
    def __init__(self, tree):
        self.tree_cache = tree


def _step(loaded=0, stall=0.0, forward_s=0.010, layers=10, bandwidth=1e9, size_per_token=1000):
    ctrl = HiCacheController(size_per_token, bandwidth)
    ctrl.step_loaded, ctrl.step_stall_s = loaded, stall
    return HiCacheStepTime(FixedStepTime(forward_s), layers)(_Batch(_Tree(ctrl))), ctrl


def test_load_back_overlaps_layer_by_layer():
    # 1,000 B a token at 1 GB/s: 50,000 tokens copy in h = 50 ms against a 10 ms forward over 10 layers:
    # copy-bound, max(c + h/L, h + c/L) = max(10 + 5, 50 + 1) = 51 ms
    t, ctrl = _step(loaded=50_000)
    assert t == pytest.approx(0.051)
    assert ctrl.pop_step_io() == (0, 0.0)  # consumed by the step
    # 5,000 tokens: h = 5 ms, compute-bound: max(10 + 0.5, 5 + 1) = 10.5 ms
    assert _step(loaded=5_000)[0] == pytest.approx(0.0105)
    assert _step()[0] == pytest.approx(0.010)  # nothing loaded: the forward alone


def test_a_blocking_write_back_adds_its_copy_to_the_step():
    assert _step(stall=0.004)[0] == pytest.approx(0.014)
    assert _step(loaded=5_000, stall=0.004)[0] == pytest.approx(0.0145)


def test_every_catalog_gpu_has_a_host_link_and_a_server_ram():
    for key, gpu in GPU_CATALOG.items():
        assert gpu.host_link_bandwidth > 0 and gpu.host_link.startswith(("PCIe", "NVLink-C2C")), key
        assert gpu.host_memory_gib and gpu.host_system, key
    h100 = get_gpu("H100")
    # PCIe Gen5 x16: 128 GB/s both ways, 64 GB/s each; a DGX H100's 2 TB
    assert (h100.host_link_bandwidth, h100.host_memory_gib) == (64e9, 2048)
    assert get_gpu("A100").host_link_bandwidth == 32e9  # PCIe Gen4
    assert 0 < HOST_LINK_EFFICIENCY <= 1
