"""Speculative decoding in the simulated scheduler: what a verify step commits, and what it reserves.

SGLang 0.5.23 decodes speculatively with its EAGLE v2 worker (``speculative/eagle_worker_v2.py``) in both event loops.
Per decode step, for every request of the batch:

1. ``check_decode_mem`` asks for the speculative reservation, not one slot: each request's allocation is grown to
   ``ceil_page(kv_committed_len + 2 x alloc_len)`` (``_new_tokens_required_next_decode_spec_v2``,
   managers/schedule_batch.py:3421-3430; ``alloc_len`` = max(steps x topk, draft tokens),
   mem_cache/allocation_sizing.py:28-70). The retraction loop converges on the same check.
2. ``eagle_prepare_for_decode`` (speculative/eagle_utils.py:857-921) allocates the growth, in batch order, from the
   allocator's head: at page 1 ``alloc_token_slots`` of the total, beyond page 1 ``alloc_extend`` from each row's
   ``kv_allocated_len`` (mem_cache/allocation.py:780-848). The draft steps and the verify pass write their KV
   there: the draft pool shares the target's slot ids.
3. The verify result commits the accepted run, bonus token included: ``kv_committed_len += accept_len`` and the
   tokens join the output (managers/scheduler_components/batch_result_processor.py:770-850). Rejected positions are
   not freed: they stay in the row's reservation and are overwritten by the next step; whatever is still
   reserved past the kept KV is freed when the request is released (``_release_overallocated_kv_indices``,
   mem_cache/common.py:447-476) or retracted.

An accepted run may pass the request's stop: the output is cut at the EOS or at max_new_tokens (stop first, then
the length cap, ``update_finish_state``, managers/schedule_batch.py:1995-2047), the KV is committed whole.

How many tokens a verify step accepts is a property of the data, not of the server: poolsim draws it from
``--speculative-accept-length MEAN`` or ``--speculative-accept-file``, deterministically from the run's seed, the
request and its output position (a retracted request that recomputes draws the same acceptances again).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class Acceptance:
    """The accept-length distribution: ``probabilities[i]`` is P(accept length = i + 1), bonus token included."""

    probabilities: tuple[float, ...]
    source: str  # "mean 2.5" | the file

    @property
    def mean(self) -> float:
        return sum((i + 1) * p for i, p in enumerate(self.probabilities))

    @staticmethod
    def from_mean(mean: float, max_accept_length: int) -> "Acceptance":
        """A draft chain whose every token is accepted with one probability p, independently, until the first
        rejection (a verify step commits the accepted drafts and the bonus token): P(L >= k) = p^(k-1), so the
        mean is (1 - p^K) / (1 - p) for K = max_accept_length; p is solved from the mean."""
        k = max_accept_length
        if not (math.isfinite(mean) and 1.0 <= mean <= k):
            raise ValueError(f"--speculative-accept-length {mean}: a verify step commits 1 to {k} tokens")
        if mean >= k:
            p = 1.0
        elif mean <= 1.0:
            p = 0.0
        else:
            lo, hi = 0.0, 1.0
            for _ in range(200):  # (1 - p^K) / (1 - p) rises from 1 at p = 0 to K at p = 1
                mid = (lo + hi) / 2
                if sum(mid ** j for j in range(k)) < mean:
                    lo = mid
                else:
                    hi = mid
            p = (lo + hi) / 2
        probs = [p ** i * (1 - p) for i in range(k - 1)] + [p ** (k - 1)]
        return Acceptance(tuple(probs), f"mean {mean:g}")

    @staticmethod
    def from_file(path: str | Path, max_accept_length: int) -> "Acceptance":
        """A JSON list of non-negative numbers, counts or probabilities: entry ``i`` for a verify step that accepted
        ``i`` draft tokens (accept length ``i + 1``), as SGLang's per-request ``spec_correct_drafts_histogram``
        counts them (managers/schedule_batch.py:1566-1572). At most ``num_steps + 1`` entries."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"--speculative-accept-file {path}: not a JSON file ({e})") from None
        if not isinstance(data, list) or not data or any(
                isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 for v in data):
            raise ValueError(f"--speculative-accept-file {path}: expected a JSON list of non-negative numbers "
                             "(entry i: steps that accepted i draft tokens)")
        while len(data) > 1 and data[-1] == 0:
            data = data[:-1]
        if len(data) > max_accept_length:
            raise ValueError(f"--speculative-accept-file {path}: {len(data)} entries, but a verify step accepts at "
                             f"most num_steps = {max_accept_length - 1} draft tokens")
        total = float(sum(data))
        if total <= 0:
            raise ValueError(f"--speculative-accept-file {path}: every entry is 0")
        probs = [v / total for v in data] + [0.0] * (max_accept_length - len(data))
        return Acceptance(tuple(probs), str(path))

    def cdf(self) -> tuple[float, ...]:
        out, acc = [], 0.0
        for p in self.probabilities:
            acc += p
            out.append(acc)
        out[-1] = 1.0
        return tuple(out)


@dataclass(frozen=True)
class SpecDecodeConfig:
    """What the scheduler needs of speculative decoding (one dp rank)."""

    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    alloc_len_per_decode: int  # get_alloc_len_per_decode at this page size
    acceptance: Acceptance
    seed: int = 0

    @property
    def reserve_per_decode(self) -> int:
        """get_alloc_reserve_per_decode: twice the step's length."""
        return 2 * self.alloc_len_per_decode


def _mix64(x: int) -> int:
    """splitmix64's finalizer: a well-mixed 64-bit value of x."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


class AcceptanceSampler:
    """Accept lengths, one per verify step of a request: a function of (seed, rid, output position) only, so a run
    is reproducible whatever the batch composition, and counters of what was drawn."""

    def __init__(self, config: SpecDecodeConfig):
        self.cdf = config.acceptance.cdf()
        self.constant = next((i + 1 for i, p in enumerate(config.acceptance.probabilities) if p == 1.0), None)
        self.seed = _mix64(config.seed & MASK64)
        self.verify_steps = 0  # request-steps verified (SGLang's spec_verify_ct, summed)
        self.accepted_tokens = 0  # tokens committed by them, bonus included (before the stop's cut)
        self.decode_steps = 0  # decode batches that verified
        self.histogram = [0] * len(self.cdf)  # verify steps by accept length - 1
        self.per_rid: dict[int, list[int]] = {}  # rid -> [verify steps, accepted tokens]

    def draw(self, rid: int, position: int) -> int:
        if self.constant is not None:
            n = self.constant
        else:
            u = _mix64(self.seed ^ _mix64((rid * 0x100000001B3 + position) & MASK64)) / 2.0 ** 64
            n = 1
            for c in self.cdf:
                if u < c:
                    break
                n += 1
            n = min(n, len(self.cdf))
        self.verify_steps += 1
        self.accepted_tokens += n
        self.histogram[n - 1] += 1
        mine = self.per_rid.get(rid)
        if mine is None:
            self.per_rid[rid] = [1, n]
        else:
            mine[0] += 1
            mine[1] += n
        return n

    def stats(self) -> dict:
        return {"verify_steps": self.verify_steps, "accepted_tokens": self.accepted_tokens,
                "decode_steps": self.decode_steps, "histogram": list(self.histogram)}


def spec_summary(algorithm: str, num_draft_tokens: int, samplers: list[AcceptanceSampler], acceptance: Acceptance,
                 step_stats: dict | None) -> dict:
    """The run's speculative decoding as the summary's ``speculative_*`` keys (reports/METRICS.md): what the flags
    asked, what the verify steps accepted, and what the draft cost."""
    verify = sum(s.verify_steps for s in samplers)
    accepted = sum(s.accepted_tokens for s in samplers)
    decode_steps = sum(s.decode_steps for s in samplers)
    histogram = [sum(col) for col in zip(*(s.histogram for s in samplers))]
    drafts = max(num_draft_tokens - 1, 1)
    return {
        "speculative_algorithm": algorithm,
        "speculative_accept_length_source": acceptance.source,
        "speculative_accept_length_expected": acceptance.mean,
        "speculative_accept_length": accepted / verify if verify else None,
        "speculative_accept_rate": (accepted - verify) / (verify * drafts) if verify else None,
        "speculative_tokens_per_step": accepted / decode_steps if decode_steps else None,
        "speculative_verify_steps": verify,
        "speculative_decode_steps": decode_steps,
        "speculative_accepted_tokens": accepted,
        "speculative_accepted_drafts_histogram": histogram,
        "speculative_draft_overhead": step_stats["draft_overhead"] if step_stats else None,
        "speculative_draft_s": step_stats["draft_s"] if step_stats else None,
        "speculative_verify_s": step_stats["verify_s"] if step_stats else None,
    }


def accept_length_through(samplers: list[AcceptanceSampler], last_rid: int) -> float | None:
    """SGLang's ``avg_spec_accept_length`` (the server's lifetime average, internal_state.py:243-253) once the
    requests up to ``last_rid`` have run: what bench_serving prints as "Accept length" after a run."""
    verify = accepted = 0
    for s in samplers:
        for rid, (v, a) in s.per_rid.items():
            if rid <= last_rid:
                verify += v
                accepted += a
    return accepted / verify if verify else None
