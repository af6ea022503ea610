"""What a request holds in the pools (SGLang's ``ReqKvInfo``), and what the pools need to know of a request.

The pools never import the simulator: they see a request through the ``ReqLike`` protocol below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass(slots=True)
class ReqKvInfo:
    req_pool_idx: int | None = None  # request row, None when the request holds no row
    kv_allocated_len: int = 0  # slots allocated in the row
    kv_committed_len: int = 0  # slots whose KV is (being) computed, <= kv_allocated_len
    cache_protected_len: int = 0  # row prefix that points at tree-owned slots (page-aligned)
    cache_inserted_len: int = 0
    # hybrid linear-attention models
    mamba_pool_idx: int | None = None  # the request's own state slot
    mamba_cow_src_index: int | None = None  # tree slot copied into ours before the forward
    # extra_buffer strategy: ping-pong slots the forward writes checkpoints into
    mamba_ping_pong_track_buffer: list[int] | None = None
    mamba_next_track_idx: int | None = None  # buffer position the next checkpoint goes to
    mamba_last_track_idx: int | None = None  # buffer position holding the newest checkpoint
    mamba_last_track_seqlen: int | None = None  # sequence length that checkpoint is the state of
    mamba_prev_track_seqlen: int | None = None
    # hybrid-SWA models: row positions [0, swa_evicted_seqlen) no longer hold SWA KV of the request's own
    swa_evicted_seqlen: int = 0
    # ReqToTokenPool.write_decode's stamp of its last decode write for this request (not SGLang state): which
    # write, at which index of its batch, and the flat table position written; never compared or shown
    decode_write: int = field(default=-1, compare=False, repr=False)
    decode_index: int = field(default=-1, compare=False, repr=False)
    decode_flat: int = field(default=-1, compare=False, repr=False)

    @property
    def holds_kv(self) -> bool:
        return self.req_pool_idx is not None

    @property
    def holds_mamba(self) -> bool:
        return self.mamba_pool_idx is not None

    def reset_for_retract(self) -> None:
        self.kv_allocated_len = 0
        self.kv_committed_len = 0
        self.cache_protected_len = 0
        self.cache_inserted_len = 0
        self.mamba_pool_idx = None  # already given back by release_kv_cache
        self.mamba_ping_pong_track_buffer = None
        self.mamba_cow_src_index = None
        self.mamba_next_track_idx = None
        self.mamba_last_track_idx = None
        self.mamba_last_track_seqlen = None
        self.mamba_prev_track_seqlen = None
        self.swa_evicted_seqlen = 0


class ReqLike(Protocol):
    kv: ReqKvInfo
    extra_key: str | None
    lock: object | None  # the tree node the request holds a lock on
    last_node: object | None
    prefix_len: int
    extend_end: int
    origin_input_len: int

    def token_ids(self, n: int) -> np.ndarray:
        """The first ``n`` tokens of ``origin_input_ids + output_ids``."""

    def finished(self) -> bool:
        """Whether generation has finished (a finished request hands its mamba state to the tree)."""
