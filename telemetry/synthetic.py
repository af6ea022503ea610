"""A forward-pass-metrics stream from a known roofline: poolsim's own schedule of a trace, each step's time the
step-time model at known coefficients times log-normal noise, written as ``poolsim record`` writes SGLang's messages.
For tests and bench/telemetry_recovery.py (a fit of this stream must recover the coefficients); never a measurement.

Each step's composition comes from the simulated batch (prefill rows' new and prefix tokens and prompt lengths,
decode rows' sequence lengths, as SGLang fills ScheduledRequestMetrics), and its time from the exact per-request
batch (``AnalyticStepTime(cost, truth)(shape)``), so the fit sees what it would see from a server: aggregates, with
the pair count approximated where a batch holds several prefills.
"""

from __future__ import annotations

import json

import numpy as np

from poolsim.sim import step_time


class _Tap:
    """A replay hook (app.run.simulate's ``replay``) that keeps each step's shape and leaves the schedule alone."""

    device = None

    def __init__(self):
        self.shapes = []

    def mamba_config(self, mamba):
        return mamba

    def step_time(self, clock, servers):
        from poolsim.kernels.replay import StepShape

        def step(batch):
            self.shapes.append(StepShape.of(batch))
            return clock(batch)
        return step


def fpm_message(shape, counter: int, wall: float, dp_rank: int = 0) -> dict:
    """SGLang's ForwardPassMetrics fields for one simulated step (metrics_reporter.py:438-482)."""
    ext, pre, dec = list(shape.extend_lens), list(shape.prefix_lens), list(shape.decode_seq_lens)
    lens = np.add(pre, ext) if ext else np.zeros(0)
    sched = {"num_prefill_requests": len(ext), "sum_prefill_tokens": int(sum(ext)),
             "var_prefill_length": float(lens.var()) if len(lens) else 0.0,
             "sum_prefill_kv_tokens": int(sum(pre)), "num_decode_requests": len(dec),
             "sum_decode_kv_tokens": int(sum(dec)), "var_decode_kv_tokens": float(np.var(dec)) if dec else 0.0}
    queued = {"num_prefill_requests": 0, "sum_prefill_tokens": 0, "var_prefill_length": 0.0,
              "num_decode_requests": 0, "sum_decode_kv_tokens": 0, "var_decode_kv_tokens": 0.0}
    return {"version": 1, "worker_id": "synthetic", "dp_rank": dp_rank, "counter_id": counter, "wall_time": wall,
            "scheduled_requests": sched, "queued_requests": queued}


def synthetic_stream(trace, model, gpu, args, truth, *, noise: float = 0.03, seed: int = 0,
                     runtime_overhead_gib=None, t0: float = 1.8e9) -> list[dict]:
    """The trace through poolsim's scheduler; one message per step, timed by the model at ``truth`` with
    ``exp(noise x N(0, 1))``; an idle heartbeat at the end, as SGLang sends when the server goes idle."""
    from poolsim.app.run import simulate
    from poolsim.telemetry.fit import cost_of

    tap = _Tap()
    simulate(trace, model, gpu, args, replay=tap, runtime_overhead_gib=runtime_overhead_gib)
    cost, _ = cost_of(model, gpu, args, runtime_overhead_gib)
    clock = step_time.AnalyticStepTime(cost, truth)
    rng = np.random.default_rng(seed)
    out, now = [], t0
    for i, shape in enumerate(tap.shapes):
        wall = float(clock(shape) * np.exp(noise * rng.standard_normal()))
        now += wall
        out.append({"timestamp": now, "endpoint": "synthetic", **fpm_message(shape, i, wall)})
    idle = fpm_message(type("Idle", (), {"extend_lens": (), "prefix_lens": (), "decode_seq_lens": ()})(),
                       len(out), 0.0)
    out.append({"timestamp": now + 1.0, "endpoint": "synthetic", **idle})
    return out


def write_jsonl(records: list[dict], path) -> None:
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
