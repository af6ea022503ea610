"""Seeded synthetic workloads: arrival processes, length distributions, shared prompts, chats and agent loops.

A workload is a set of sessions. Session starts follow a renewal process (Poisson when ``cv == 1``, gamma with
coefficient of variation ``cv`` otherwise) run through a rate profile (constant, step or diurnal) by a time change.
Each session sends ``turns`` requests, ``think_time_s`` apart on average (exponential, counted from the previous
turn's arrival: open loop, so include the expected answer time). Turn ``k + 1``'s prompt is turn ``k``'s prompt,
turn ``k``'s output segment and a new user segment, so the tokens the simulator decodes for turn ``k`` are exactly
what turn ``k + 1``'s prompt holds. A session's first prompt starts with one of the shared system prompts (each
used by ``system_prompt_fanout`` sessions). Everything is drawn from ``numpy.random.default_rng(seed)`` in a
fixed order, so a seed gives the same trace on every machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from poolsim.traces.request import MAX_ARRIVAL_S, MAX_SEGMENT_LEN, Request
from poolsim.traces.trace import Trace


class RateProfile(Protocol):
    def inverse(self, s: np.ndarray) -> np.ndarray:
        """Seconds at which the expected number of arrivals since 0 reaches ``s`` (a time change)."""


class LengthDist(Protocol):
    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` int64 lengths in [1, 2**20]."""


@dataclass(frozen=True)
class ConstantRate:
    rate: float  # per second

    def __post_init__(self):
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"rate must be a finite number > 0, got {self.rate}")

    def inverse(self, s: np.ndarray) -> np.ndarray:
        return s / self.rate


@dataclass(frozen=True)
class StepRate:
    times_s: tuple[float, ...]  # start of each step; the first is 0, the last step lasts forever
    rates: tuple[float, ...]  # per second; 0 is a pause, the last one must be > 0

    def __post_init__(self):
        t = np.asarray(self.times_s, dtype=float)
        if len(t) == 0 or len(t) != len(self.rates) or t[0] != 0 or np.any(np.diff(t) <= 0):
            raise ValueError("step times must start at 0, increase, and pair with one rate each")
        if min(self.rates) < 0 or self.rates[-1] <= 0 or not all(map(math.isfinite, self.rates)):
            raise ValueError("step rates must be finite and >= 0, the last one > 0")

    def inverse(self, s: np.ndarray) -> np.ndarray:
        t, r = np.asarray(self.times_s, dtype=float), np.asarray(self.rates, dtype=float)
        cum = np.concatenate([[0.0], np.cumsum(np.diff(t) * r[:-1])])  # expected arrivals by each step start
        i = np.searchsorted(cum, s, side="right") - 1  # the last step starting at or before s: never a pause
        return t[i] + (s - cum[i]) / r[i]


@dataclass(frozen=True)
class DiurnalRate:
    mean_rate: float  # per second
    amplitude: float  # in [0, 1]: rate(t) = mean_rate * (1 - amplitude * cos(2 pi t / period_s))
    period_s: float = 86400.0

    def __post_init__(self):
        if not (self.mean_rate > 0 and 0 <= self.amplitude <= 1 and self.period_s > 0):
            raise ValueError("need mean_rate > 0, 0 <= amplitude <= 1, period_s > 0")

    def cumulative(self, t: np.ndarray) -> np.ndarray:
        w = 2 * math.pi / self.period_s
        return self.mean_rate * (t - self.amplitude * np.sin(w * t) / w)

    def inverse(self, s: np.ndarray) -> np.ndarray:
        # cumulative(t) is within mean_rate * amplitude / w of mean_rate * t: bisect inside that bracket
        slack = self.amplitude * self.period_s / (2 * math.pi)
        lo, hi = np.maximum(s / self.mean_rate - slack, 0.0), s / self.mean_rate + slack
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            below = self.cumulative(mid) < s
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        return 0.5 * (lo + hi)


def arrival_times(rng: np.random.Generator, n: int, rate: float | RateProfile, cv: float = 1.0) -> np.ndarray:
    """``n`` sorted arrival times (s): unit-mean gaps (exponential if cv == 1, else gamma) through the profile."""
    profile = ConstantRate(float(rate)) if isinstance(rate, (int, float)) else rate
    if not (math.isfinite(cv) and cv > 0):
        raise ValueError(f"cv must be a finite number > 0, got {cv}")
    if cv == 1.0:
        gaps = rng.exponential(1.0, n)
    else:
        shape = 1.0 / cv**2
        gaps = rng.gamma(shape, 1.0 / shape, n)
    return profile.inverse(np.cumsum(gaps))


def _clip(x: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x), 1, MAX_SEGMENT_LEN).astype(np.int64)


@dataclass(frozen=True)
class Fixed:
    value: int

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _clip(np.full(n, self.value))


@dataclass(frozen=True)
class Uniform:
    lo: int
    hi: int  # inclusive

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.hi < self.lo:
            raise ValueError(f"uniform needs lo <= hi, got {self.lo}, {self.hi}")
        return _clip(rng.integers(self.lo, self.hi + 1, n))


@dataclass(frozen=True)
class LogNormal:
    median: float
    sigma: float  # of the underlying normal
    lo: int = 1
    hi: int = MAX_SEGMENT_LEN

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = rng.lognormal(math.log(self.median), self.sigma, n)
        return _clip(np.clip(x, self.lo, self.hi))


@dataclass(frozen=True)
class Empirical:
    values: tuple[int, ...]  # drawn uniformly with replacement

    @classmethod
    def from_trace(cls, trace, which: str) -> Empirical:
        """The input (``"input"``) or output (``"output"``) lengths of a trace."""
        attr = {"input": "input_len", "output": "output_len"}[which]
        values = tuple(getattr(r, attr) for r in trace)
        if not values:
            raise ValueError("an empirical distribution needs a trace with at least one request")
        return cls(values)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _clip(rng.choice(np.asarray(self.values), n))


@dataclass(frozen=True)
class WorkloadSpec:
    num_sessions: int
    rate: float | RateProfile = 1.0  # session starts per second
    cv: float = 1.0  # burstiness of session starts (1 = Poisson)
    turns: LengthDist = field(default_factory=lambda: Fixed(1))  # requests per session
    think_time_s: float = 0.0  # mean gap between a session's turns
    system_prompt_len: int = 0  # tokens of the shared system prompt or agent context; 0 = none
    system_prompt_fanout: int = 1  # sessions sharing each system prompt
    input_len: LengthDist = field(default_factory=lambda: Fixed(128))  # new user tokens per turn
    output_len: LengthDist = field(default_factory=lambda: Fixed(128))  # where generation stops
    max_new_tokens: int | None = None  # outputs are clipped to it; None = the trace does not say
    ignore_eos: bool = False  # then every output runs to max_new_tokens
    max_prompt_len: int | None = None  # a session ends before a turn whose prompt would be longer

    def __post_init__(self):
        if self.num_sessions < 0 or self.system_prompt_fanout < 1 or self.think_time_s < 0:
            raise ValueError("need num_sessions >= 0, system_prompt_fanout >= 1, think_time_s >= 0")
        if not 0 <= self.system_prompt_len <= MAX_SEGMENT_LEN:
            raise ValueError(f"system_prompt_len must lie in [0, 2**20], got {self.system_prompt_len}")
        if self.ignore_eos and self.max_new_tokens is None:
            raise ValueError("ignore_eos needs max_new_tokens (generation then runs to that limit)")


def chat_spec(num_sessions: int = 100, rate=0.5, **overrides) -> WorkloadSpec:
    """Multi-turn chat: a short shared system prompt, a few turns of a few hundred tokens, 30 s think time."""
    base = WorkloadSpec(num_sessions=num_sessions, rate=rate, turns=Uniform(1, 6), think_time_s=30.0,
                        system_prompt_len=400, system_prompt_fanout=50, input_len=LogNormal(120, 1.0, 4, 4000),
                        output_len=LogNormal(200, 0.8, 4, 2000), max_prompt_len=32768)
    return replace(base, **overrides)


def agent_spec(num_sessions: int = 50, rate=0.2, **overrides) -> WorkloadSpec:
    """Agent loops: a long shared context, many short turns (tool call out, tool result in) seconds apart."""
    base = WorkloadSpec(num_sessions=num_sessions, rate=rate, turns=Uniform(5, 20), think_time_s=2.0,
                        system_prompt_len=6000, system_prompt_fanout=25, input_len=LogNormal(200, 0.8, 8, 4000),
                        output_len=LogNormal(60, 0.6, 4, 1000), max_prompt_len=65536)
    return replace(base, **overrides)


def generate(spec: WorkloadSpec, seed: int = 0, name: str = "generated") -> Trace:
    """The workload as a trace whose requests are built when iterated: memory holds a few numbers per request,
    not every prompt's segment list (a session's turn k repeats its k earlier turns)."""
    rng = np.random.default_rng(seed)
    n = spec.num_sessions
    starts = arrival_times(rng, n, spec.rate, spec.cv)
    turns = spec.turns.sample(rng, n) if n else np.zeros(0, np.int64)
    total = int(turns.sum())
    user_lens = spec.input_len.sample(rng, total)
    out_lens = spec.output_len.sample(rng, total)
    thinks = rng.exponential(spec.think_time_s, total) if spec.think_time_s > 0 else np.zeros(total)
    num_prompts = -(-n // spec.system_prompt_fanout)
    prompt_of = rng.permutation(np.repeat(np.arange(num_prompts), spec.system_prompt_fanout)[:n])
    if spec.max_new_tokens is not None:
        out_lens = np.full(total, spec.max_new_tokens) if spec.ignore_eos else np.minimum(out_lens, spec.max_new_tokens)
    # one entry per request kept, in session order; a session's requests are consecutive, turns 0, 1, ...
    arrival, session, turn, draw = (np.empty(total), np.empty(total, np.int64), np.empty(total, np.int64),
                                    np.empty(total, np.int64))
    kept, first = 0, 0
    for s in range(n):
        input_len = spec.system_prompt_len
        t = float(starts[s])
        for i in range(first, first + int(turns[s])):
            input_len += int(user_lens[i])
            if spec.max_prompt_len is not None and input_len > spec.max_prompt_len:
                break
            arrival[kept], session[kept], turn[kept], draw[kept] = t, s, i - first, i
            kept += 1
            input_len += int(out_lens[i])
            t += float(thinks[i])
        first += int(turns[s])
    if kept and arrival[:kept].max() > MAX_ARRIVAL_S:
        raise ValueError(f"the workload's last request arrives at {arrival[:kept].max():.4g} s, more than a year "
                         "in: raise --rate or lower --sessions")
    order = np.argsort(arrival[:kept], kind="stable")  # by arrival; ties keep session order, as sorted() does

    def request(rid: int, e: int) -> Request:
        # segment ids: 0..num_prompts-1 the system prompts, then a (user, output) pair per request kept
        k, uid = int(turn[e]), num_prompts + 2 * e
        segs = [(int(prompt_of[session[e]]), spec.system_prompt_len)] if spec.system_prompt_len else []
        for j in range(e - k, e):
            uid_j = num_prompts + 2 * j
            segs += [(uid_j, int(user_lens[draw[j]])), (uid_j + 1, int(out_lens[draw[j]]))]
        segs.append((uid, int(user_lens[draw[e]])))
        return Request(rid=rid, arrival_s=float(arrival[e]), input_len=sum(m for _, m in segs),
                       output_len=int(out_lens[draw[e]]), max_new_tokens=spec.max_new_tokens,
                       ignore_eos=spec.ignore_eos, session_id=f"s{int(session[e])}", turn=k, segments=tuple(segs),
                       output_segment=uid + 1)

    return Trace(lambda: (request(rid, int(e)) for rid, e in enumerate(order)), name=name, format="generated",
                 num_requests=kept)


def parse_length(spec: str) -> LengthDist:
    """``fixed:N``, ``uniform:LO,HI``, ``lognormal:MEDIAN,SIGMA[,LO,HI]`` or ``empirical:input|output,TRACE``."""
    kind, _, args = spec.partition(":")
    try:
        if kind == "empirical":
            which, _, path = args.partition(",")
            from poolsim.traces.load import load_trace

            return Empirical.from_trace(load_trace(path), which)
        nums = [float(a) for a in args.split(",")] if args else []
        if kind == "fixed" and len(nums) == 1:
            return Fixed(int(nums[0]))
        if kind == "uniform" and len(nums) == 2:
            return Uniform(int(nums[0]), int(nums[1]))
        if kind == "lognormal" and len(nums) in (2, 4):
            return LogNormal(nums[0], nums[1], *map(int, nums[2:]))
    except (KeyError, ValueError) as e:
        raise ValueError(f"bad length distribution {spec!r}: {e}") from None
    raise ValueError(f"bad length distribution {spec!r}: use fixed:N, uniform:LO,HI, lognormal:MEDIAN,SIGMA[,LO,HI] "
                     "or empirical:input|output,TRACE")


def parse_rate(spec: str) -> float | RateProfile:
    """``5`` (per second), ``step:0=2,60=5`` (2/s from t=0 s, 5/s from t=60 s) or ``diurnal:MEAN,AMPLITUDE[,PERIOD]``."""
    kind, _, args = spec.partition(":")
    try:
        if not args:
            return ConstantRate(float(kind)).rate
        if kind == "step":
            pairs = [p.split("=") for p in args.split(",")]
            return StepRate(tuple(float(t) for t, _ in pairs), tuple(float(r) for _, r in pairs))
        if kind == "diurnal":
            return DiurnalRate(*(float(a) for a in args.split(",")))
    except (TypeError, ValueError) as e:
        raise ValueError(f"bad rate {spec!r}: {e}") from None
    raise ValueError(f"bad rate {spec!r}: use a number, step:T=R,T=R,... or diurnal:MEAN,AMPLITUDE[,PERIOD_S]")
