"""Accelerators poolsim can size for: memory, HBM bandwidth and dense peak FLOP/s, each from its datasheet.

``memory_mib`` is what SGLang's capacity probe reads (``get_device_memory_capacity``,
``srt/utils/common.py:990``): ``nvidia-smi --query-gpu=memory.total`` in MiB on NVIDIA
(``:802-837``), ``rocminfo`` pool 1 size / 1024 on AMD (``:682-707``). SGLang picks its
``chunked_prefill_size``, CUDA-graph batch size and default ``mem_fraction_static`` from it.
``memory_bytes`` is the total that ``torch.cuda.mem_get_info`` starts from.
FLOP/s are dense (no 2:4 sparsity); ``fp8_flops`` is None where the chip has no FP8 tensor cores.
``link_bandwidth`` is one GPU's scale-up bandwidth per direction (what a ring all-reduce or an
all-to-all between the GPUs of one server can use), from the vendor's interconnect datasheet;
``interconnect`` names the fabric. The step-time model divides collective bytes by it.
``host_link_bandwidth`` is one GPU's link to host memory per direction (its PCIe generation and width, from the
GPU's datasheet; NVLink-C2C on Grace systems), ``host_link`` names it: HiCache's device<->host copies run over it.
``host_memory_gib`` is the RAM of the typical server that GPU ships in (``host_system`` names it, with its
datasheet): the default of ``--host-memory-gib``, against which SGLang checks HiCache's host pools. A server
bought with other memory should pass its own.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

MIB = 2**20
GIB = 2**30
TB = 10**12  # datasheets quote decimal TB/s and TFLOP/s
MAX_CUSTOM_MEMORY_GIB = 10_000  # per GPU: the largest today hold under 300 GiB


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_mib: float  # as SGLang's capacity probe reports it
    hbm_bandwidth: float  # B/s
    bf16_flops: float  # dense FLOP/s
    fp8_flops: float | None  # dense FLOP/s; None: no FP8 tensor cores
    arch: str  # sm80 | sm89 | sm90 | sm100 | gfx942: picks SGLang's default attention backend
    memory_bytes: int | None = None  # physical total if it differs from memory_mib (AMD)
    link_bandwidth: float = 450e9  # B/s per direction to the other GPUs of the server (scale-up fabric)
    interconnect: str = "NVLink 4"
    # the server (node) the GPU comes in: GPUs per node and each GPU's scale-out link to other nodes, B/s per
    # direction (None: not from a datasheet; poolsim then checks no node layout)
    gpus_per_node: int | None = None
    scale_out_bandwidth: float | None = None
    scale_out: str | None = None
    host_link_bandwidth: float = 64e9  # B/s per direction to host memory (PCIe Gen5 x16 unless said otherwise)
    host_link: str = "PCIe Gen5 x16"
    host_memory_gib: float | None = None  # RAM of the typical server of this GPU (None: unknown)
    host_system: str = ""  # the server host_memory_gib is from

    @property
    def total_bytes(self) -> int:
        return self.memory_bytes if self.memory_bytes is not None else int(self.memory_mib * MIB)

    @property
    def vendor(self) -> str:
        return "amd" if self.arch.startswith("gfx") else "nvidia"

    @staticmethod
    def custom(name: str = "custom", memory_gib: float = 80.0, bandwidth_tbs: float = 3.35,
               bf16_tflops: float = 989.0, fp8_tflops: float | None = None, arch: str = "sm90",
               link_gbs: float = 450.0, interconnect: str = "custom") -> "GPUSpec":
        """A GPU from flags: memory in GiB, bandwidth in TB/s, dense TFLOP/s, link GB/s per direction."""
        for flag, value, limit in (("--gpu-memory-gib", memory_gib, MAX_CUSTOM_MEMORY_GIB),
                                   ("--gpu-bandwidth-tbs", bandwidth_tbs, None), ("--gpu-bf16-tflops", bf16_tflops, None),
                                   ("--gpu-fp8-tflops", fp8_tflops, None)):
            if value is None and flag == "--gpu-fp8-tflops":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{flag} {value:g}: a custom GPU needs a finite number > 0" if isinstance(value, float)
                                 else f"{flag} {value!r}: a custom GPU needs a finite number > 0")
            if limit is not None and value > limit:
                raise ValueError(f"{flag} {value:g}: more than any accelerator has ({limit:,} GiB)")
        if link_gbs <= 0:
            raise ValueError(f"custom GPU needs a positive link bandwidth ({link_gbs} GB/s)")
        if arch not in ARCHS:
            raise ValueError(f"custom GPU arch {arch!r} is not one of {', '.join(ARCHS)}")
        return GPUSpec(name=name, memory_mib=memory_gib * 1024, hbm_bandwidth=bandwidth_tbs * TB,
                       bf16_flops=bf16_tflops * TB, fp8_flops=None if fp8_tflops is None else fp8_tflops * TB,
                       arch=arch, link_bandwidth=link_gbs * 1e9, interconnect=interconnect)

    def to_dict(self) -> dict:
        return {**asdict(self), "total_bytes": self.total_bytes}


ARCHS = ("sm80", "sm89", "sm90", "sm100", "gfx942")

GPU_CATALOG: dict[str, GPUSpec] = {
    # NVIDIA H100 SXM5 80GB datasheet (nvidia.com/en-us/data-center/h100): HBM3 3.35 TB/s,
    # BF16 1,979 TFLOPS and FP8 3,958 TFLOPS "with sparsity" -> dense is half.
    # nvidia-smi memory.total 81559 MiB (e.g. sgl-project/sglang#7478).
    # NVLink 4: 18 links, 900 GB/s bidirectional per GPU -> 450 GB/s per direction.
    # HGX/DGX H100 (DGX H100 datasheet): 8 GPUs per node, 8x single-port ConnectX-7 VPI, 400 Gb/s InfiniBand
    # NDR per GPU -> 50 GB/s per direction.
    # Host side: PCIe Gen5 x16, 128 GB/s bidirectional (H100 datasheet) -> 64 GB/s per direction; DGX H100
    # datasheet: 2 TB system memory.
    "h100": GPUSpec("H100 80GB SXM", 81559, 3.35 * TB, 989.5 * TB, 1979 * TB, "sm90",
                    link_bandwidth=450e9, interconnect="NVLink 4", gpus_per_node=8, scale_out_bandwidth=50e9,
                    scale_out="InfiniBand NDR 400 Gb/s per GPU",
                    host_link_bandwidth=64e9, host_link="PCIe Gen5 x16", host_memory_gib=2048,
                    host_system="DGX H100, 8 GPUs, 2 TB"),
    # NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): 141 GB HBM3e, 4.8 TB/s,
    # BF16 1,979 / FP8 3,958 TFLOPS with sparsity. nvidia-smi memory.total 143771 MiB.
    # NVLink 4, 900 GB/s bidirectional (H200 datasheet) -> 450 GB/s per direction.
    # HGX/DGX H200 (DGX H200 datasheet): 8 GPUs per node, 8x ConnectX-7 400 Gb/s InfiniBand NDR -> 50 GB/s.
    # Host side: PCIe Gen5 128 GB/s bidirectional (H200 datasheet) -> 64 GB/s per direction; DGX H200 datasheet:
    # 2 TB system memory.
    "h200": GPUSpec("H200 141GB SXM", 143771, 4.8 * TB, 989.5 * TB, 1979 * TB, "sm90",
                    link_bandwidth=450e9, interconnect="NVLink 4", gpus_per_node=8, scale_out_bandwidth=50e9,
                    scale_out="InfiniBand NDR 400 Gb/s per GPU",
                    host_link_bandwidth=64e9, host_link="PCIe Gen5 x16", host_memory_gib=2048,
                    host_system="DGX H200, 8 GPUs, 2 TB"),
    # NVIDIA HGX B200 datasheet (nvidia.com/en-us/data-center/hgx): per GPU 180 GB HBM3e, 8 TB/s,
    # FP8 9 PFLOPS and BF16 4.5 PFLOPS with sparsity -> 4.5 / 2.25 PFLOPS dense.
    # nvidia-smi memory.total 183359 MiB.
    # NVLink 5: 1.8 TB/s bidirectional per GPU (HGX B200 datasheet) -> 900 GB/s per direction.
    # DGX B200 datasheet: 8 GPUs per node, 8x single-port ConnectX-7 VPI up to 400 Gb/s -> 50 GB/s.
    # Host side: PCIe Gen5 x16 per GPU, 64 GB/s per direction (HGX B200); DGX B200 datasheet: 2 TB system memory
    # (configurable to 4 TB).
    "b200": GPUSpec("B200 180GB", 183359, 8.0 * TB, 2250 * TB, 4500 * TB, "sm100",
                    link_bandwidth=900e9, interconnect="NVLink 5", gpus_per_node=8, scale_out_bandwidth=50e9,
                    scale_out="InfiniBand NDR 400 Gb/s per GPU",
                    host_link_bandwidth=64e9, host_link="PCIe Gen5 x16", host_memory_gib=2048,
                    host_system="DGX B200, 8 GPUs, 2 TB"),
    # NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100): A100 80GB SXM 2,039 GB/s,
    # A100 40GB SXM 1,555 GB/s; BF16 312 TFLOPS dense; no FP8. nvidia-smi 81920 / 40960 MiB.
    # NVLink 3: 600 GB/s bidirectional per GPU (A100 datasheet) -> 300 GB/s per direction.
    # DGX A100 datasheet: 8 GPUs per node, 8x single-port ConnectX-6 VPI 200 Gb/s HDR InfiniBand -> 25 GB/s.
    # Host side: PCIe Gen4 64 GB/s bidirectional (A100 datasheet) -> 32 GB/s per direction; DGX A100 datasheet:
    # 2 TB system memory with 8x A100 80GB (DGX A100 640GB), 1 TB with 8x A100 40GB (320GB).
    "a100-80gb": GPUSpec("A100 80GB SXM", 81920, 2.039 * TB, 312 * TB, None, "sm80",
                         link_bandwidth=300e9, interconnect="NVLink 3", gpus_per_node=8, scale_out_bandwidth=25e9,
                         scale_out="InfiniBand HDR 200 Gb/s per GPU",
                         host_link_bandwidth=32e9, host_link="PCIe Gen4 x16", host_memory_gib=2048,
                         host_system="DGX A100 640GB, 8 GPUs, 2 TB"),
    "a100-40gb": GPUSpec("A100 40GB SXM", 40960, 1.555 * TB, 312 * TB, None, "sm80",
                         link_bandwidth=300e9, interconnect="NVLink 3", gpus_per_node=8, scale_out_bandwidth=25e9,
                         scale_out="InfiniBand HDR 200 Gb/s per GPU",
                         host_link_bandwidth=32e9, host_link="PCIe Gen4 x16", host_memory_gib=1024,
                         host_system="DGX A100 320GB, 8 GPUs, 1 TB"),
    # NVIDIA L40S datasheet: 48 GB GDDR6 864 GB/s; BF16 362.05 TFLOPS, FP8 733 TFLOPS dense
    # (733 / 1,466 with sparsity). nvidia-smi memory.total 46068 MiB.
    # No NVLink: PCIe Gen4 x16, 64 GB/s bidirectional (L40S datasheet) -> 32 GB/s per direction.
    # Host side: the same PCIe Gen4 x16 link. RAM: no NVIDIA reference system; 1 TB assumed for an 8-GPU L40S
    # server (a typical OEM build; pass --host-memory-gib for yours).
    "l40s": GPUSpec("L40S 48GB", 46068, 0.864 * TB, 362.05 * TB, 733 * TB, "sm89",
                    link_bandwidth=32e9, interconnect="PCIe Gen4 x16",
                    host_link_bandwidth=32e9, host_link="PCIe Gen4 x16", host_memory_gib=1024,
                    host_system="8-GPU L40S server, 1 TB (assumed, no reference system)"),
    # NVIDIA L4 datasheet: 24 GB GDDR6 300 GB/s; BF16 242 / FP8 485 TFLOPS with sparsity
    # -> 121 / 242.5 dense. nvidia-smi memory.total 23034 MiB.
    # PCIe Gen4 x16 (L4 datasheet): 32 GB/s per direction.
    # Host side: the same PCIe Gen4 x16 link. RAM: no NVIDIA reference system; 512 GB assumed for an 8-GPU L4
    # server (a typical OEM build; pass --host-memory-gib for yours).
    "l4": GPUSpec("L4 24GB", 23034, 0.300 * TB, 121 * TB, 242.5 * TB, "sm89",
                  link_bandwidth=32e9, interconnect="PCIe Gen4 x16",
                  host_link_bandwidth=32e9, host_link="PCIe Gen4 x16", host_memory_gib=512,
                  host_system="8-GPU L4 server, 512 GB (assumed, no reference system)"),
    # AMD Instinct MI300X datasheet (amd.com): 192 GB HBM3 5.3 TB/s; BF16 1,307.4 TFLOPS and
    # FP8 2,614.9 TFLOPS dense. rocminfo pool 1: 201310208 KB -> 196592 MiB (what SGLang reads);
    # rocm-smi VRAM Total Memory 205822885888 B (what torch sees).
    "mi300x": GPUSpec("MI300X 192GB", 196592, 5.3 * TB, 1307.4 * TB, 2614.9 * TB, "gfx942",
                      memory_bytes=205822885888, link_bandwidth=448e9,
                      # Infinity Fabric: 7 links x 64 GB/s per direction to the 7 peers of an
                      # 8-GPU platform (MI300X datasheet: 896 GB/s aggregate bidirectional)
                      interconnect="Infinity Fabric",
                      # Host side: PCIe Gen5 x16, 128 GB/s bidirectional (MI300X datasheet) -> 64 GB/s per
                      # direction. RAM: 2 TB assumed for an 8-GPU MI300X platform server (a typical OEM build).
                      host_link_bandwidth=64e9, host_link="PCIe Gen5 x16", host_memory_gib=2048,
                      host_system="8-GPU MI300X platform, 2 TB (assumed, typical OEM build)"),
}

_ALIASES = {
    "h100-80gb": "h100", "h100-sxm": "h100", "h200-141gb": "h200", "b200-180gb": "b200",
    "a100": "a100-80gb", "a100-80g": "a100-80gb", "a100-40g": "a100-40gb", "l40s-48gb": "l40s", "l4-24gb": "l4",
}


def get_gpu(name: str) -> GPUSpec:
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    key = _ALIASES.get(key, key)
    try:
        return GPU_CATALOG[key]
    except KeyError:
        raise ValueError(f"--gpu {name!r} is not in the catalog; known: {', '.join(GPU_CATALOG)}") from None
