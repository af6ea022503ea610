"""The server a command describes, from its flags: the model, the GPU, ``ServerArgs`` and the runtime overhead."""

from __future__ import annotations

from dataclasses import fields

from poolsim.pools.hardware.gpu_catalog import GPUSpec, get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.server_args import ServerArgs

# poolsim's own flags for a GPU outside the catalog
CUSTOM_GPU_FLAGS = ("gpu_memory_gib", "gpu_bandwidth_tbs", "gpu_bf16_tflops", "gpu_fp8_tflops", "gpu_arch")


def load_server(flags: dict) -> tuple[ModelConfig, GPUSpec, ServerArgs, float | None]:
    """(model, GPU, ServerArgs, runtime_overhead_gib) from a command's flags: ``model``, ``gpu``,
    ``runtime_overhead_gib``, the custom-GPU ones and every ServerArgs field by its name."""
    model = ModelConfig.load(flags["model"])
    gpu = load_gpu(flags["gpu"], *(flags[k] for k in CUSTOM_GPU_FLAGS))
    args = ServerArgs(**{f.name: flags[f.name] for f in fields(ServerArgs)})
    if args.dp_size < 1:
        raise ValueError(f"--dp {args.dp_size}: must be >= 1")
    return model, gpu, args, flags["runtime_overhead_gib"]


def load_gpu(name: str | None, memory_gib: float | None = None, bandwidth_tbs: float | None = None,
             bf16_tflops: float | None = None, fp8_tflops: float | None = None, arch: str | None = None) -> GPUSpec:
    """A catalog GPU, or a custom one when its memory is given (the rest default to an H100's)."""
    if memory_gib is not None:
        return GPUSpec.custom(name or "custom", memory_gib, bandwidth_tbs or 3.35, bf16_tflops or 989.0,
                              fp8_tflops, arch or "sm90")
    if name is None:
        raise ValueError("--gpu is required (a catalog name, or --gpu-memory-gib for a custom GPU)")
    return get_gpu(name)


def second_model_args(args: ServerArgs, tp: int | None) -> ServerArgs:
    """A second model beside the first (``plan --against``, ``run --compare-model``): the same flags at its own tp
    (default: the first's), with its own mamba cache size (the first model's slot count does not carry over)."""
    return args.replace(tp_size=tp or args.tp_size, max_mamba_cache_size=None)
