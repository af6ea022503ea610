"""``poolsim capacity``: how much traffic a configuration takes. The highest arrival-rate scale ``x`` (the trace's
inter-arrival gaps divided by ``x``, lengths and prefix structure kept: traces.scale_trace) at which the verdict
still holds with the p99 SLO, each point simulated in full.

The search: scales double from 1 (or halve, when 1 already fails) until one fails and one holds, then bisect
geometrically between the two. Every point is a whole simulation, so a point "holds" exactly when ``run`` on the
scaled trace says FITS (retractions allowed) with the SLO met. For a fixed point a looser SLO can only turn a
failure into a pass, and the search's path moves right with every such turn, so a looser SLO never gives a lower
capacity (tested).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

from poolsim.app.run import simulate
from poolsim.pools.hardware.gpu_catalog import GPUSpec
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.plan import plan_memory
from poolsim.pools.sizing.server_args import ServerArgs
from poolsim.traces import scale_trace

MAX_DOUBLINGS = 12  # 4096x the trace's rate, or 1/4096 of it, before the search gives up
BISECTIONS = 6  # the final bracket is within 2**(1/64) ~ 1.1 % of its lower end


@dataclass
class LoadPoint:
    scale: float
    holds: bool
    verdict_status: str
    arrival_rate_req_s: float | None
    throughput_req_s: float
    output_tok_s: float
    p99_s: float | None  # the SLO's metric (e2e or ttft)


@dataclass
class Capacity:
    slo_p99_s: float
    slo_on: str
    scale: float | None  # the highest scale that holds; None when even the slowest tried fails
    bracket: tuple[float | None, float | None]  # (highest holding, lowest failing) scale
    points: list[LoadPoint] = field(default_factory=list)

    @property
    def best(self) -> LoadPoint | None:
        held = [p for p in self.points if p.holds and p.scale == self.scale]
        return held[0] if held else None

    def to_dict(self) -> dict:
        best = self.best
        return {"slo_p99_s": self.slo_p99_s, "slo_on": self.slo_on, "capacity_scale": self.scale,
                "bracket": list(self.bracket),
                "sustained_req_s": best.throughput_req_s if best else None,
                "sustained_output_tok_s": best.output_tok_s if best else None,
                "arrival_rate_req_s": best.arrival_rate_req_s if best else None,
                "points": [asdict(p) for p in sorted(self.points, key=lambda p: p.scale)]}


def find_capacity(trace, model: ModelConfig, gpu: GPUSpec, args: ServerArgs, slo_p99_s: float,
                  slo_on: str = "e2e", progress: Callable[[LoadPoint], None] | None = None,
                  **run_opts) -> Capacity:
    """``trace``: a loaded trace (iterable more than once); ``run_opts``: simulate()'s other options."""
    if not (isinstance(slo_p99_s, (int, float)) and math.isfinite(slo_p99_s) and slo_p99_s > 0):
        raise ValueError(f"--slo-p99-s {slo_p99_s:g}: expected a positive number of seconds")
    result = Capacity(slo_p99_s, slo_on, None, (None, None))
    seen: dict[float, LoadPoint] = {}
    if "plan" not in run_opts:  # one server, many loads: sized once
        run_opts["plan"] = plan_memory(model, gpu, args, runtime_overhead_gib=run_opts.get("runtime_overhead_gib"))

    def point(scale: float) -> LoadPoint:
        if scale not in seen:
            r = simulate(scale_trace(trace, scale), model, gpu, args, slo_p99_s=slo_p99_s, slo_on=slo_on,
                         **run_opts)
            s = r.summary
            metric = s["e2e_s" if slo_on == "e2e" else "ttft_s"]["p99"]
            seen[scale] = LoadPoint(scale, s["verdict_status"] != "does_not_fit", s["verdict_status"],
                                    s["arrival_rate_req_s"], s["throughput_req_s"], s["output_tok_s"], metric)
            result.points.append(seen[scale])
            if progress is not None:
                progress(seen[scale])
        return seen[scale]

    step = 2.0 if point(1.0).holds else 0.5
    last = 1.0
    for _ in range(MAX_DOUBLINGS):
        nxt = last * step
        if point(nxt).holds != point(last).holds:
            break
        last = nxt
    else:
        held = point(last).holds
        result.scale = last if held else None
        result.bracket = (last, None) if held else (None, last)
        return result
    lo, hi = (last, nxt) if step > 1 else (nxt, last)  # lo holds, hi fails
    for _ in range(BISECTIONS):
        mid = math.sqrt(lo * hi)
        if point(mid).holds:
            lo = mid
        else:
            hi = mid
    result.scale, result.bracket = lo, (lo, hi)
    return result
