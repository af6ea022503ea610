"""The server a command describes, from its flags: the model, the GPU, ``ServerArgs`` and the runtime overhead."""

from __future__ import annotations

import math
import sys
from dataclasses import fields

from poolsim.pools.hardware.gpu_catalog import TB, GPUSpec, get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.server_args import ServerArgs

# poolsim's own flags for a GPU outside the catalog
CUSTOM_GPU_FLAGS = ("gpu_memory_gib", "gpu_bandwidth_tbs", "gpu_bf16_tflops", "gpu_fp8_tflops", "gpu_arch")


def load_server(flags: dict) -> tuple[ModelConfig, GPUSpec, ServerArgs, float | None]:
    """(model, GPU, ServerArgs, runtime_overhead_gib) from a command's flags: ``model``, ``gpu``,
    ``runtime_overhead_gib``, the custom-GPU ones and every ServerArgs field by its name."""
    overhead = flags["runtime_overhead_gib"]
    if overhead is not None and not (isinstance(overhead, (int, float)) and math.isfinite(overhead) and overhead >= 0):
        raise ValueError(f"--runtime-overhead-gib {overhead:g}: must be a finite number of GiB >= 0")
    model = ModelConfig.load(flags["model"])
    gpu = load_gpu(flags["gpu"], *(flags[k] for k in CUSTOM_GPU_FLAGS))
    args = ServerArgs(**{f.name: flags[f.name] for f in fields(ServerArgs)})  # its numbers checked on creation
    return model, gpu, args, overhead


def load_gpu(name: str | None, memory_gib: float | None = None, bandwidth_tbs: float | None = None,
             bf16_tflops: float | None = None, fp8_tflops: float | None = None, arch: str | None = None) -> GPUSpec:
    """A catalog GPU, or a custom one when its memory is given. What the flags leave out is an H100 SXM's
    (datasheet), said on stderr: every latency depends on the bandwidth and the FLOP/s."""
    if memory_gib is not None:
        h100 = get_gpu("H100")
        gpu = GPUSpec.custom(name or "custom", memory_gib,
                             h100.hbm_bandwidth / TB if bandwidth_tbs is None else bandwidth_tbs,
                             h100.bf16_flops / TB if bf16_tflops is None else bf16_tflops,
                             fp8_tflops, arch or h100.arch)
        for flag, given, assumed in (("--gpu-bandwidth-tbs", bandwidth_tbs, f"{h100.hbm_bandwidth / TB:g} TB/s"),
                                     ("--gpu-bf16-tflops", bf16_tflops, f"{h100.bf16_flops / TB:g} dense TFLOP/s"),
                                     ("--gpu-arch", arch, h100.arch)):
            if given is None:
                sys.stderr.write(f"WARNING custom GPU: {flag} not given; assumed {assumed}, an {h100.name}'s "
                                 "(datasheet); every latency depends on it\n")
        return gpu
    if name is None:
        raise ValueError("--gpu is required (a catalog name, or --gpu-memory-gib for a custom GPU)")
    return get_gpu(name)


def second_model_args(args: ServerArgs, tp: int | None) -> ServerArgs:
    """A second model beside the first (``plan --against``, ``run --compare-model``): the same flags at its own tp
    (default: the first's), with its own mamba cache size (the first model's slot count does not carry over)."""
    return args.replace(tp_size=tp or args.tp_size, max_mamba_cache_size=None)
