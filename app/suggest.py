"""When the verdict is DOES NOT FIT: the smallest change along a sweep's axes that fits the same trace.

Candidates, in order of how much they change: twice the dp replicas, twice the tp, the next larger GPU of the
same vendor at the same tp and dp, then four times the replicas. Each is simulated in full on the same trace with
the same options (the SLO included); the first whose verdict is not DOES NOT FIT is the answer, shown as the flags
to change. At most ``MAX_TRIES`` simulations: a short search, not a sweep (`poolsim sweep` is that).
"""

from __future__ import annotations

from dataclasses import dataclass

from poolsim.pools.hardware.gpu_catalog import GPU_CATALOG, GPUSpec
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.server_args import ServerArgs

MAX_TRIES = 4
MAX_TP = 8  # one node's GPUs: a larger tp group is a multi-node deployment, not a small change


@dataclass
class Suggestion:
    flags: dict  # flag -> value: what changes against the run that did not fit
    gpus: int  # GPUs in the whole server
    verdict_status: str
    p99_e2e_s: float | None
    tried: list[str]  # every candidate simulated, in order, as flag text

    def flag_text(self) -> str:
        return " ".join(f"{k} {v}" for k, v in self.flags.items())

    def to_dict(self) -> dict:
        return {"flags": self.flags, "gpus": self.gpus, "verdict_status": self.verdict_status,
                "p99_e2e_s": self.p99_e2e_s, "tried": self.tried}


def _larger_gpu(gpu: GPUSpec) -> tuple[str, GPUSpec] | None:
    """The catalog GPU of the same vendor with the least memory above ``gpu``'s that is no slower (bandwidth and
    FLOP/s at least ``gpu``'s: an A100 80GB holds a few MiB more than an H100 but is no upgrade); None: none is."""
    bigger = [(name, g) for name, g in GPU_CATALOG.items()
              if g.vendor == gpu.vendor and g.memory_mib > gpu.memory_mib and g.hbm_bandwidth >= gpu.hbm_bandwidth
              and g.bf16_flops >= gpu.bf16_flops]
    return min(bigger, key=lambda item: item[1].memory_mib) if bigger else None


def candidates(gpu: GPUSpec, args: ServerArgs) -> list[tuple[dict, GPUSpec, ServerArgs]]:
    out = [({"--dp": args.dp_size * 2}, gpu, args.replace(dp_size=args.dp_size * 2))]
    if args.tp_size * 2 <= MAX_TP:
        out.append(({"--tp": args.tp_size * 2}, gpu, args.replace(tp_size=args.tp_size * 2)))
    larger = _larger_gpu(gpu)
    if larger is not None:
        out.append(({"--gpu": larger[0].upper()}, larger[1], args))
    out.append(({"--dp": args.dp_size * 4}, gpu, args.replace(dp_size=args.dp_size * 4)))
    return out[:MAX_TRIES]


def what_would_fit(trace, model: ModelConfig, gpu: GPUSpec, args: ServerArgs, **run_opts) -> Suggestion | None:
    """The first candidate that fits ``trace``, or None when none of them does (or each is refused)."""
    from poolsim.app.run import simulate

    tried = []
    for flags, g, a in candidates(gpu, args):
        tried.append(" ".join(f"{k} {v}" for k, v in flags.items()))
        try:
            s = simulate(trace, model, g, a, **{k: v for k, v in run_opts.items() if k != "plan"}).summary
        except (ValueError, RuntimeError):  # SGLang would refuse this one (tp not dividing the heads, no KV left)
            continue
        if s["verdict_status"] != "does_not_fit":
            return Suggestion(flags, a.tp_size * a.dp_size, s["verdict_status"], s["e2e_s"]["p99"], tried)
    return None
