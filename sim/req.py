"""A request inside the simulated server (SGLang's ``Req``): its lengths, its pool holdings, its timeline."""

from __future__ import annotations

from typing import Any

import numpy as np

from poolsim.pools.mem_cache.req_kv import ReqKvInfo
from poolsim.traces.request import MAX_SEGMENT_LEN

OUTPUT_IDS_ROOM = 4096  # output ids built with the prompt; a longer output grows its ids by doubling


class Req:
    __slots__ = ("rid", "trace_req", "arrival_s", "origin_input_len", "target_output_len", "max_new_tokens",
                 "ignore_eos", "extra_key", "num_output", "kv", "prefix_len", "extend_end", "last_node", "lock",
                 "mamba_branching_seqlen", "retraction_count", "is_retracted", "finished_reason", "aborted",
                 "inflight_middle_chunks", "num_matched_prefix_tokens", "_prompt", "_ids", "cached_tokens",
                 "admission_steps", "first_token_time", "first_token_step", "finish_time", "finish_step", "replica",
                 "tokens_not_cached", "to_finish", "abort_cause", "decode_batch_idx", "swa_branching_seqlen",
                 "host_hit_length", "best_match_node", "host_loaded_tokens")

    def __init__(self, rid: int, trace_req, max_new_tokens: int, ignore_eos: bool = False):
        self.rid = rid
        self.trace_req = trace_req
        self.arrival_s = float(trace_req.arrival_s)
        self.origin_input_len = int(trace_req.input_len)
        self.target_output_len = int(trace_req.output_len)  # where generation stops (EOS)
        self.max_new_tokens = int(max_new_tokens)  # what admission reserves for; set_length stops here
        self.ignore_eos = ignore_eos
        self.extra_key = getattr(trace_req, "namespace", None)
        self.num_output = 0  # len(output_ids)
        self.kv = ReqKvInfo()
        self.prefix_len = 0
        self.extend_end = 0
        self.last_node: Any = None  # a TreeNode
        self.lock: Any = None
        self.mamba_branching_seqlen: int | None = None
        self.swa_branching_seqlen: int | None = None  # hybrid SWA: where the first checkpoint stops (see SWARadixCache)
        self.retraction_count = 0
        self.is_retracted = False
        self.finished_reason: str | None = None  # "length" | "stop" | "abort"
        self.aborted = False
        self.inflight_middle_chunks = 0
        self.num_matched_prefix_tokens = 0
        self._prompt: np.ndarray | None = None
        self._ids: np.ndarray | None = None  # prompt + the first few output ids, grown by doubling (read-only)
        self.cached_tokens: list[int] = []  # prefix hit at each admission
        self.admission_steps: list[int] = []
        self.first_token_time: float | None = None
        self.first_token_step: int | None = None
        self.finish_time: float | None = None
        self.finish_step: int | None = None
        self.replica = 0
        self.tokens_not_cached = 0  # KV computed but not kept by the tree at finish (unaligned tail, no state)
        self.to_finish: str | None = None  # an abort cause applied when the next output lands (SGLang's to_finish)
        self.abort_cause: str | None = None  # why an aborted request was aborted (reports/METRICS.md)
        self.decode_batch_idx = 0  # decode batches prepared for it since its (re-)admission
        # HiCache (pools/mem_cache/hiradix_cache.py): the last match's host hit behind the device prefix, where it
        # ends, and the prompt tokens loaded back from host over the request's admissions
        self.host_hit_length = 0
        self.best_match_node: Any = None
        self.host_loaded_tokens = 0

    # ---------------------------------------------------------------- lengths
    @property
    def seqlen(self) -> int:
        return self.origin_input_len + self.num_output

    @property
    def output_stop_len(self) -> int:
        """Output length at which the request finishes: EOS or max_new_tokens, whichever first."""
        if self.ignore_eos:
            return self.max_new_tokens
        return min(self.target_output_len, self.max_new_tokens)

    def finished(self) -> bool:
        return self.finished_reason is not None

    def next_output_finishes_by_length(self) -> bool:
        return self.num_output + 1 >= self.max_new_tokens

    def owned_kv_len(self) -> int:
        if self.finished_reason is None or self.aborted:
            return self.kv.kv_committed_len
        return min(self.kv.kv_committed_len, self.origin_input_len + self.num_output)

    # ---------------------------------------------------------------- token identity
    def prompt_tokens(self) -> np.ndarray:
        if self._prompt is None:
            # the prompt and the first outputs in one array written once: inserts past the prompt (finish,
            # decode checkpoints) then slice it instead of concatenating a copy of the prompt
            room = min(self.output_stop_len, OUTPUT_IDS_ROOM)
            ids = self.trace_req.tokens_with_output(room)
            ids.flags.writeable = False
            if ids.base is not None and ids.base.base is None:
                ids.base.flags.writeable = False  # the buffer under the slice: tree keys may then be views of it
            self._ids = ids
            self._prompt = ids[: self.origin_input_len]
        return self._prompt

    def token_ids(self, n: int) -> np.ndarray:
        """The first ``n`` tokens of ``origin_input_ids + output_ids``."""
        ids = self._ids
        if ids is not None and n <= len(ids):
            return ids[:n]
        prompt = self.prompt_tokens()
        if n <= len(prompt):
            return prompt[:n]
        ids = self._ids
        if ids is None or n > len(ids):  # one concatenation per doubling, not one per call (checkpoints)
            grown = 0 if ids is None else 2 * (len(ids) - len(prompt))
            ids = np.concatenate([prompt, self.trace_req.output_tokens(
                max(n - len(prompt), min(max(grown, 32), MAX_SEGMENT_LEN)))])
            ids.flags.writeable = False
            self._ids = ids
        return ids[:n]

    def drop_token_cache(self) -> None:
        self._prompt = self._ids = None

    # ---------------------------------------------------------------- output
    def set_finish_with_abort(self, cause: str) -> None:
        """``Req.set_finish_with_abort``: the prompt becomes the single token 0 (so its prefill is one token) and
        the request finishes as an abort when that token's output lands."""
        self.origin_input_len = 1
        self._prompt, self._ids = np.zeros(1, dtype=np.int64), None
        self.to_finish = cause

    def append_output(self) -> None:
        """One sampled token; update the finish state as ``update_finish_state`` does."""
        n = self.num_output = self.num_output + 1
        if self.to_finish is not None:  # a pending abort wins over every other finish
            self.finished_reason, self.aborted, self.abort_cause = "abort", True, self.to_finish
            self.to_finish = None
            return
        if n >= self.max_new_tokens:
            self.finished_reason = "length"
        elif n >= self.target_output_len and not self.ignore_eos:
            self.finished_reason = "stop"

    def append_outputs(self, n: int) -> None:
        """A verify step's accepted run of ``n`` tokens (speculative decoding), with ``update_finish_state``'s
        cut (managers/schedule_batch.py:1995-2047): the output stops at the EOS inside the run, else at
        max_new_tokens; a stop past max_new_tokens is a length finish there. One token is ``append_output``."""
        if n <= 1:
            self.append_output()
            return
        total = self.num_output + n
        if self.to_finish is not None:
            self.num_output = total
            self.finished_reason, self.aborted, self.abort_cause = "abort", True, self.to_finish
            self.to_finish = None
            return
        stop = self.target_output_len if not self.ignore_eos else None
        if stop is not None and stop <= total and stop < self.max_new_tokens:
            self.num_output, self.finished_reason = max(stop, self.num_output + 1), "stop"
        elif total >= self.max_new_tokens:
            self.num_output, self.finished_reason = self.max_new_tokens, "length"
        else:
            self.num_output = total

    def reset_for_retract(self) -> None:
        self.retraction_count += 1
        self.prefix_len = 0
        self.last_node = None
        self.lock = None
        self.extend_end = 0
        self.is_retracted = True
        self.inflight_middle_chunks = 0
        self.mamba_branching_seqlen = None
        self.swa_branching_seqlen = None
        self.num_matched_prefix_tokens = 0
        self.decode_batch_idx = 0
        self.kv.reset_for_retract()
