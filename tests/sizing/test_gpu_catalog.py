"""GPU catalog: what SGLang's capacity probe reads and what torch sees."""

import pytest

from poolsim.pools.hardware.gpu_catalog import GPU_CATALOG, GPUSpec, get_gpu


def test_catalog_covers_the_issue_gpus_with_datasheet_figures():
    assert set(GPU_CATALOG) >= {"h100", "h200", "b200", "a100-40gb", "a100-80gb", "l40s", "l4", "mi300x"}
    h100 = get_gpu("H100")
    assert h100.total_bytes == 81559 * 2**20  # nvidia-smi memory.total, MiB
    assert (h100.hbm_bandwidth, h100.bf16_flops, h100.fp8_flops) == (3.35e12, 989.5e12, 1979e12)
    assert get_gpu("a100").fp8_flops is None  # no FP8 tensor cores on Ampere
    mi300x = get_gpu("mi300x")
    assert mi300x.memory_mib == 201310208 / 1024  # rocminfo pool size in KB / 1024, what SGLang reads
    assert mi300x.total_bytes == 205822885888 and mi300x.vendor == "amd"


def test_custom_gpu_from_flags_and_its_errors():
    g = GPUSpec.custom("mine", memory_gib=48, bandwidth_tbs=1.0, bf16_tflops=200, fp8_tflops=400, arch="sm89")
    assert (g.total_bytes, g.hbm_bandwidth, g.bf16_flops, g.fp8_flops) == (48 * 2**30, 1e12, 200e12, 400e12)
    with pytest.raises(ValueError, match="--gpu-memory-gib 0: a custom GPU needs a finite number > 0"):
        GPUSpec.custom(memory_gib=0)
    for flag, kwargs in (("--gpu-memory-gib inf", {"memory_gib": float("inf")}),
                         ("--gpu-memory-gib nan", {"memory_gib": float("nan")}),
                         ("--gpu-bandwidth-tbs 0", {"bandwidth_tbs": 0.0}),
                         ("--gpu-bf16-tflops -1", {"bf16_tflops": -1.0})):
        with pytest.raises(ValueError, match=f"^{flag}: a custom GPU needs a finite number > 0$"):
            GPUSpec.custom(**kwargs)
    with pytest.raises(ValueError, match=r"^--gpu-memory-gib 1e\+12: more than any accelerator has \(10,000 GiB\)$"):
        GPUSpec.custom(memory_gib=1e12)
    with pytest.raises(ValueError, match="custom GPU arch 'sm75' is not one of"):
        GPUSpec.custom(arch="sm75")
    with pytest.raises(ValueError, match=r"^--gpu 'v100' is not in the catalog; known: h100, "):
        get_gpu("v100")
