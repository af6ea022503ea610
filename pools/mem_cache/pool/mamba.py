"""Linear-attention state: per-slot state shapes (``configs/mamba_utils.py``) and ``MambaPool``.

A request holds one slot for its whole life; a slot holds, per linear layer, the causal-conv
window(s) and the recurrent ("temporal"/SSM) state. Slot 0 is the padding slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from poolsim.pools.dtypes import dtype_bytes, torch_store_dtype
from poolsim.pools.errors import PoolError
from poolsim.pools.mem_cache.allocator.mamba import MambaSlotAllocator


def _divide(n: int, d: int, what: str) -> int:
    if n % d:
        raise PoolError(f"{what} ({n}) is not divisible by tp ({d})")
    return n // d


@dataclass(frozen=True)
class MambaStateShape:
    """Per-slot, per-layer state shapes on one tp rank."""

    conv: list[tuple[int, ...]]
    temporal: tuple[int, int, int]
    kind: str = "mamba2"  # "kda" | "gdn" | "mamba2"

    @staticmethod
    def kimi_linear(tp: int, num_heads: int, head_dim: int, conv_kernel_size: int = 4,
                    num_k_heads: int | None = None, head_k_dim: int | None = None) -> "MambaStateShape":
        """KDA: one conv tensor ``(K-1, q + k + v channels / tp)`` and temporal ``(H/tp, D, D)``."""
        num_k_heads = num_heads if num_k_heads is None else num_k_heads
        head_k_dim = head_dim if head_k_dim is None else head_k_dim
        proj = _divide(num_heads * head_dim, tp, "KDA num_heads * head_dim")
        proj_k = _divide(num_k_heads * head_k_dim, tp, "KDA num_k_heads * head_k_dim")
        temporal = (_divide(num_heads, tp, "KDA num_heads"), head_dim, head_dim)
        return MambaStateShape(conv=[(conv_kernel_size - 1, proj + 2 * proj_k)], temporal=temporal, kind="kda")

    @staticmethod
    def mamba2(tp: int, intermediate_size: int, n_groups: int, num_heads: int, head_dim: int,
               state_size: int, conv_kernel: int, kind: str = "mamba2") -> "MambaStateShape":
        """Mamba2 and GDN: conv ``(conv_dim/tp, K-1)``, temporal ``(heads/tp, head_dim, state_size)``."""
        if n_groups % tp:
            n_groups += tp - n_groups  # groups are replicated so every head shard has its group
        conv_dim = intermediate_size + 2 * n_groups * state_size
        conv: list[tuple[int, ...]] = [(_divide(conv_dim, tp, "conv_dim"), conv_kernel - 1)]
        temporal = (_divide(num_heads, tp, "linear-attention heads"), head_dim, state_size)
        return MambaStateShape(conv=conv, temporal=temporal, kind=kind)

    def conv_numel(self) -> int:
        return sum(prod(s) for s in self.conv)

    def temporal_numel(self) -> int:
        return prod(self.temporal)


@dataclass(frozen=True)
class MambaCacheParams:
    shape: MambaStateShape
    layers: list[int]  # global layer ids of the linear-attention layers
    conv_dtype: str = "bfloat16"
    ssm_dtype: str = "float32"
    extra: dict = field(default_factory=dict)

    @property
    def mamba_cache_per_req(self) -> int:
        """Bytes of one slot over all linear layers (``mamba_cache_per_req``)."""
        per_layer = (self.shape.conv_numel() * dtype_bytes(self.conv_dtype)
                     + self.shape.temporal_numel() * dtype_bytes(self.ssm_dtype))
        return per_layer * len(self.layers)


class MambaPool:
    """``size`` usable slots (``size + 1`` allocated per state tensor) and their slot allocator."""

    def __init__(self, size: int, cache_params: MambaCacheParams, device: str | None = None):
        self.size = size
        self.cache_params = cache_params
        self.device = device
        self.num_layers = len(cache_params.layers)
        self.allocator = MambaSlotAllocator(size, device)
        if device is not None:
            import torch

            shape = cache_params.shape
            self.conv = [torch.zeros((self.num_layers, size + 1, *s), dtype=torch_store_dtype(cache_params.conv_dtype),
                                     device=device) for s in shape.conv]
            self.temporal = torch.zeros((self.num_layers, size + 1, *shape.temporal),
                                        dtype=torch_store_dtype(cache_params.ssm_dtype), device=device)

    def conv_state_bytes(self) -> int:
        return (self.size + 1) * self.num_layers * self.cache_params.shape.conv_numel() * \
            dtype_bytes(self.cache_params.conv_dtype)

    def ssm_state_bytes(self) -> int:
        return (self.size + 1) * self.num_layers * self.cache_params.shape.temporal_numel() * \
            dtype_bytes(self.cache_params.ssm_dtype)

    def mem_usage_bytes(self) -> int:
        return self.conv_state_bytes() + self.ssm_state_bytes()

    # slot bookkeeping is the allocator's
    def available_size(self) -> int:
        return self.allocator.available_size()

    def alloc(self, need_size: int):
        return self.allocator.alloc(need_size)

    def free(self, free_index) -> None:
        self.allocator.free(free_index)

    def copy_from(self, src_index, dst_index) -> None:
        """Copy conv and temporal state slot to slot (copy-on-write on a prefix hit, fork on checkpoint)."""
        if self.device is None:
            return  # the numpy pool tracks slots, not state values
        src = self.allocator.xp.asarray(src_index)
        dst = self.allocator.xp.asarray(dst_index)
        for conv in self.conv:
            conv[:, dst] = conv[:, src]
        self.temporal[:, dst] = self.temporal[:, src]

    def clear_slots(self, index) -> None:
        if self.device is None:
            return
        idx = self.allocator.xp.asarray(index)
        for conv in self.conv:
            conv[:, idx] = 0
        self.temporal[:, idx] = 0

    def check_integrity(self) -> None:
        self.allocator.check_integrity()
