"""One simulation end to end: model + GPU + SGLang flags + trace -> frames, summary, run record.

    plan_memory (pools.sizing.plan)  ->  one server per dp rank (sim.server)  ->  Simulation (sim.engine)
    ->  Recorder frames  ->  summarize (reports.summary)
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Callable

import pandas as pd

from poolsim.app.plan import compare_plans
from poolsim.pools.hardware.gpu_catalog import GPUSpec
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.plan import MemoryPlan, plan_memory
from poolsim.pools.sizing.server_args import ServerArgs
from poolsim.reports.summary import SLO_METRICS, SUMMARY_STEP_COLUMNS, summarize
from poolsim.sim import ROUTERS
from poolsim.sim.engine import Simulation
from poolsim.sim.metrics import CHUNK_ROWS, HOST_STEP_COLUMNS, Recorder
from poolsim.sim.scheduler import SchedulerConfig
from poolsim.sim.server import HiCacheConfig, MambaConfig, SWAConfig, build_server
from poolsim.sim.speculative import Acceptance, SpecDecodeConfig, spec_summary
from poolsim.sim.step_time import (
    HOST_LINK_EFFICIENCY,
    MEASURED_ERROR,
    AnalyticStepTime,
    Coefficients,
    FixedStepTime,
    HiCacheStepTime,
    ModelCost,
    SpecCost,
    calibration_source,
    prior_only_note,
)

COMPARE_CONTEXT_LENS = [1024, 4096, 16384, 65536, 131072, 262144, 1048576]


@contextlib.contextmanager
def cycle_collector_paused():
    """The event loop allocates millions of short-lived containers but almost no reference cycles (about
    3,000 unreachable objects over the whole Mooncake trace), so the cycle collector's hundreds of passes
    only cost time (about 5 % of a whole-trace run). Paused for the loop and restored after it, as
    ``timeit`` does; what little garbage there is waits for the next collection."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def poolsim_version() -> str:
    try:
        return version("poolsim")
    except PackageNotFoundError:
        return "unknown"


@dataclass
class RunResult:
    steps: pd.DataFrame
    requests: pd.DataFrame
    summary: dict
    run: dict
    plan: MemoryPlan
    token_times: dict | None = None  # rid -> output token times (simulate(token_times=True))
    spec_samplers: list | None = None  # speculative decoding: each server's acceptance counters


def max_new_tokens_policy(policy: str) -> Callable:
    """How a trace request becomes SGLang's (max_new_tokens, ignore_eos).

    ``trace`` (default): the trace's max_new_tokens when it has one, else its output length (as SGLang's
    bench_serving sends). ``fixed:N``: the client asks for N tokens; generation still stops at the
    trace's output length (EOS). ``ignore_eos``: max_new_tokens = output length and ignore_eos set.
    """
    if policy == "trace":
        return lambda t: (t.max_new_tokens if getattr(t, "max_new_tokens", None) else t.output_len,
                          bool(getattr(t, "ignore_eos", False)))
    if policy == "ignore_eos":
        return lambda t: (t.output_len, True)
    if policy.startswith("fixed:"):
        try:
            n = int(policy.split(":", 1)[1])
        except ValueError:
            n = 0
        if n <= 0:
            raise ValueError(f"--max-new-tokens-policy {policy!r}: N must be a positive integer")
        return lambda t: (n, False)
    raise ValueError(f"--max-new-tokens-policy {policy!r}: expected trace, ignore_eos or fixed:N")


def spec_decode_config(plan: MemoryPlan, seed: int = 0) -> SpecDecodeConfig | None:
    """The scheduler's speculative decoding from the plan, with the acceptance the flags give (run and bench need
    one: acceptance is the data's)."""
    sp = plan.speculative
    if sp is None:
        return None
    k = sp.num_steps + 1
    if sp.accept_length is not None:
        acceptance = Acceptance.from_mean(sp.accept_length, k)
    elif sp.accept_file is not None:
        acceptance = Acceptance.from_file(sp.accept_file, k)
    else:
        raise ValueError(f"--speculative-algorithm {sp.requested}: give --speculative-accept-length MEAN (tokens per "
                         f"verify step, bonus included, 1 to {k}) or --speculative-accept-file: how many drafts the "
                         "data accepts is not the server's to say")
    return SpecDecodeConfig(num_steps=sp.num_steps, eagle_topk=sp.eagle_topk, num_draft_tokens=sp.num_draft_tokens,
                            alloc_len_per_decode=sp.alloc_len_per_decode, acceptance=acceptance, seed=seed)


def scheduler_config(plan: MemoryPlan, args: ServerArgs, seed: int = 0) -> SchedulerConfig:
    rows = plan.max_running_requests
    requested = args.max_running_requests or (plan.speculative.max_running_requests if plan.speculative else None)
    if args.dp_size > 1 and requested:
        rows = min(rows, max(1, requested // args.dp_size))
    overlap = not (args.disable_overlap_schedule or plan.overlap_forced_off)
    spec = spec_decode_config(plan, seed)
    width = plan.max_context_len
    if spec is not None:  # a row holds the reservation past the context (SGLang writes past a narrower row at page 1)
        width = max(width, plan.context_len + spec.reserve_per_decode + plan.page_size)
    return SchedulerConfig(
        page_size=plan.page_size,
        max_total_num_tokens=plan.max_total_num_tokens,
        max_running_requests=rows,
        context_len=plan.context_len,
        max_context_len=width,
        max_prefill_tokens=plan.max_prefill_tokens,
        chunked_prefill_size=plan.chunked_prefill_size,
        schedule_policy=args.schedule_policy,
        schedule_conservativeness=args.schedule_conservativeness,
        enable_overlap=overlap,
        enable_mixed_chunk=args.enable_mixed_chunk,
        scheduler_recv_interval=args.scheduler_recv_interval,
        speculative=spec,
    )


def mamba_config(plan: MemoryPlan, args: ServerArgs, overlap: bool) -> MambaConfig | None:
    if not plan.is_hybrid:
        return None
    strategy = "extra_buffer" if (plan.mamba_strategy or "").startswith("extra_buffer") else "no_buffer"
    return MambaConfig(max_mamba_cache_size=plan.max_mamba_cache_size, cache_params=plan.mamba_cache_params(),
                       strategy=strategy, ping_pong_track_buffer_size=2 if overlap else 1,
                       mamba_track_interval=args.mamba_track_interval)


def swa_config(plan: MemoryPlan, args: ServerArgs, model: ModelConfig) -> SWAConfig | None:
    """A hybrid-SWA plan runs on two pools; never on one: admission and release differ slot for slot."""
    if not plan.is_hybrid_swa:
        return None
    if args.disable_radix_cache:  # SGLang then frees out-of-window KV during prefill too; not modelled
        raise ValueError(f"--model {model.name}: run simulates hybrid-SWA models with the radix cache on only "
                         "(--disable-radix-cache takes SGLang's no-prefix-sharing SWA path, not modelled)")
    if plan.is_hybrid:
        raise ValueError(f"--model {model.name}: run does not simulate SWA together with mamba state pools")
    return SWAConfig(swa_max_total_num_tokens=plan.swa_max_total_num_tokens,
                     sliding_window_size=plan.sliding_window)


def hicache_config(plan: MemoryPlan, args: ServerArgs, gpu: GPUSpec, model: ModelConfig) -> HiCacheConfig | None:
    """The host tier ``run`` simulates: the host pool ``plan`` sized, SGLang's write policy, the host link."""
    h = plan.hicache
    if h is None:
        return None
    if plan.is_hybrid or plan.is_hybrid_swa:
        raise ValueError(f"--model {model.name}: run simulates the HiCache host tier for MHA and MLA models; `plan` "
                         "sizes this model's host pools (the mamba host pool included) but run does not move them")
    if h.host_memory_mode == "buffer_only":
        raise ValueError("--hicache-host-memory-mode buffer_only: the host pool only stages copies to the storage "
                         "backend, which run does not simulate (use cache mode)")
    return HiCacheConfig(host_tokens=h.host_tokens, size_per_token=h.size_per_token, write_policy=h.write_policy,
                         bandwidth=gpu.host_link_bandwidth * HOST_LINK_EFFICIENCY)


def hybrid_compare(model: ModelConfig, gpu: GPUSpec, args: ServerArgs, plan: MemoryPlan,
                   runtime_overhead_gib: float | None) -> dict | None:
    """Bytes per request and max concurrency vs context length: the hybrid and its all-full-attention twin."""
    if not plan.is_hybrid:
        return None
    lens = [n for n in COMPARE_CONTEXT_LENS if n <= plan.context_len] or [plan.context_len]
    compared = compare_plans(model, gpu, args, plan, lens, runtime_overhead_gib=runtime_overhead_gib)
    hybrid = [r for r in compared["records"] if r["model"] == model.name]
    full = [r for r in compared["records"] if r["model"] != model.name]  # the twin: no --against here
    return {"context_len": lens, "full_attn_model": full[0]["model"],
            "hybrid_bytes_per_request": [r["bytes_per_request"] for r in hybrid],
            "full_attn_bytes_per_request": [r["bytes_per_request"] for r in full],
            "hybrid_max_concurrency": [r["max_concurrency"] for r in hybrid],
            "full_attn_max_concurrency": [r["max_concurrency"] for r in full],
            "crossover_context_len": compared["crossover_context_len"]}


def check_router(router: str) -> None:
    if router not in ROUTERS:
        raise ValueError(f"--router {router!r}: expected one of {', '.join(ROUTERS)}")


def check_run_options(router: str = "round_robin", max_concurrency: int | None = None, slo_on: str = "e2e",
                      slo_p99_s: float | None = None) -> None:
    """simulate's own options, checked before anything is sized: a caller that plans first checks them first."""
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"--max-concurrency {max_concurrency}: must be >= 1")
    if slo_on not in SLO_METRICS:
        raise ValueError(f"--slo-on {slo_on!r}: expected one of {', '.join(SLO_METRICS)}")
    if slo_p99_s is not None and not (math.isfinite(slo_p99_s) and slo_p99_s > 0):
        raise ValueError(f"--slo-p99-s {slo_p99_s:g}: expected a positive number of seconds")
    check_router(router)


def simulate(trace, model: ModelConfig, gpu: GPUSpec, args: ServerArgs, *, trace_info: dict | None = None,
             seed: int = 0, max_new_tokens: str = "trace", router: str = "round_robin",
             step_time: str = "analytic", calibration: str | None = None,
             runtime_overhead_gib: float | None = None, check: bool = False,
             progress: Callable | None = None, max_concurrency: int | None = None,
             token_times: bool = False, slo_p99_s: float | None = None, slo_on: str = "e2e",
             replay=None, stream_dir=None, table_format: str = "csv", chunk_rows: int = CHUNK_ROWS,
             keep_steps: bool = True, plan: MemoryPlan | None = None) -> RunResult:
    """``trace``: requests in arrival order, optionally with ``sim.engine.Barrier`` items between phases.
    ``max_concurrency``: at most N requests in flight; the next is sent when one finishes (bench_serving's
    ``--max-concurrency``); a request's ``arrival_s`` in the frames is then its send time. ``token_times``:
    also return when each output token landed (per-token ITL). ``slo_p99_s``/``slo_on``: a p99 latency target
    (e2e or ttft) the verdict checks (reports/summary.py). ``replay`` (kernels.replay): the same simulation with the
    pools on ``replay.device`` and a step-time hook ``replay.step_time(clock, servers)`` that measures each step
    and returns the clock's time (the schedule is unchanged); ``replay.mamba_config`` sizes the device state
    tensors. None: the plain simulation. ``stream_dir``: also write the step table there
    (steps.csv / steps.parquet) chunk by chunk as it runs. ``keep_steps`` False: ``RunResult.steps`` holds only
    the columns the summary reads (reports.summary.SUMMARY_STEP_COLUMNS; the same values, so the same summary),
    for a caller that has the whole table on disk. ``plan``: ``plan_memory(model, gpu, args, runtime_overhead_gib=
    runtime_overhead_gib)`` when the caller has it already (it is not planned again)."""
    check_run_options(router, max_concurrency, slo_on, slo_p99_s)
    for flag, value, what in (("--attn-dp-size", args.attn_dp_size, "one scheduler per attention-DP group"),
                              ("--ep-size", args.ep_size, "the expert all-to-all in the step time"),
                              ("--pp-size", args.pp_size, "the pipeline's micro-batches and send/recv"),
                              ("--nnodes", args.nnodes, "collectives over the inter-node link")):
        if value > 1:  # sized by plan; the scheduler and the time model do not have them yet
            raise ValueError(f"{flag} {value}: run does not yet simulate {what}; `poolsim plan` sizes this server")
    if plan is None:
        plan = plan_memory(model, gpu, args, runtime_overhead_gib=runtime_overhead_gib)
    config = scheduler_config(plan, args, seed)
    if config.speculative is not None and (plan.is_hybrid or plan.is_hybrid_swa):
        raise ValueError(f"--model {model.name}: run simulates speculative decoding on single-pool models only (the "
                         "verify buffers of mamba states and the SWA pool's eviction are sized by plan, not "
                         "simulated)")
    mamba = mamba_config(plan, args, config.enable_overlap)
    device = None
    if replay is not None:
        device, mamba = replay.device, replay.mamba_config(mamba)
    swa = swa_config(plan, args, model)
    hicache = hicache_config(plan, args, gpu, model)
    recorder = Recorder(stream_dir, table_format, chunk_rows,
                        extra_step_columns=HOST_STEP_COLUMNS if hicache is not None else ())
    servers = [build_server(config, mamba=mamba, disable_radix_cache=args.disable_radix_cache,
                            recorder=recorder, replica=i, device=device, checks=check,
                            swa=swa, hicache=hicache) for i in range(args.dp_size)]
    clock = _step_time(step_time, model, gpu, plan, calibration, args)
    if hicache is not None:
        clock = HiCacheStepTime(clock, model.num_hidden_layers)
    step_fn = clock if replay is None else _replay_step(replay.step_time(clock, servers), clock)
    sim = Simulation(servers, step_fn, recorder, max_new_tokens_for=max_new_tokens_policy(max_new_tokens),
                     router=router, progress=progress, check_every_step=check, max_concurrency=max_concurrency,
                     record_token_times=token_times)
    with cycle_collector_paused():
        sim.run(trace)
    steps = recorder.step_frame(None if keep_steps else SUMMARY_STEP_COLUMNS + HOST_STEP_COLUMNS)
    requests = recorder.request_frame()
    meta = {"max_total_num_tokens": config.max_total_num_tokens, "max_running_requests": config.max_running_requests,
            "max_mamba_cache_size": plan.max_mamba_cache_size or 0, "page_size": config.page_size,
            "swa_max_total_num_tokens": swa.swa_max_total_num_tokens if swa else 0,
            "context_len": config.max_context_len, "dp_size": args.dp_size,
            "retraction_events": [e for s in servers for e in s.retraction_events],
            "slo_p99_s": slo_p99_s, "slo_on": slo_on}
    if config.speculative is not None:
        stats = clock.spec_stats() if hasattr(clock, "spec_stats") else None
        meta["speculative"] = spec_summary(plan.speculative.algorithm, plan.speculative.num_draft_tokens,
                                           [s.spec_sampler for s in servers], config.speculative.acceptance, stats)
    if hicache is not None:
        meta["hicache"] = {"host_tokens": hicache.host_tokens, "size_per_token": hicache.size_per_token,
                           "write_policy": hicache.write_policy, "hicache_ratio": plan.hicache.hicache_ratio,
                           "link_bandwidth_bytes_s": hicache.bandwidth,
                           "storage_backend": plan.hicache.storage_backend,
                           "recomputed_host_hit_tokens": sum(s.tree_cache.num_recomputed_host_tokens for s in servers),
                           "backup_skipped_tokens": sum(s.tree_cache.num_backup_skipped_tokens for s in servers),
                           "demoted_tokens": sum(s.tree_cache.num_demoted_tokens for s in servers)}
    summary = summarize(steps, requests, meta)
    run = {
        "poolsim_version": poolsim_version(), "model": model.name, "gpu": gpu.name,
        "server_args": dataclasses.asdict(args), "trace": trace_info or {}, "seed": seed,
        "max_new_tokens_policy": max_new_tokens, "router": router, "step_time_model": clock.describe(),
        "overlap_schedule": config.enable_overlap, "memory_plan": plan.to_dict(),
        "hybrid_compare": hybrid_compare(model, gpu, args, plan, runtime_overhead_gib),
        "max_concurrency": max_concurrency, "phase_starts_s": sim.barrier_times,
    }
    return RunResult(steps, requests, summary, run, plan, sim.token_times,
                     [s.spec_sampler for s in servers] if config.speculative is not None else None)


def _replay_step(hook, clock):
    """The replay's hook times the steps; the clock still says how long a request spends outside them, so the
    replayed schedule is the plain run's."""
    def step(batch):
        return hook(batch)
    step.request_cpu_s = getattr(clock, "request_cpu_s", 0.0)
    return step


def check_step_time(spec: str, calibration) -> None:
    """A calibration file sets the analytic model's coefficients: with a fixed step time it would be ignored."""
    if calibration and spec.startswith("fixed:"):
        raise ValueError(f"--calibration {calibration} has no effect with --step-time {spec}: a calibration sets "
                         f"the analytic model's coefficients; drop one of the two flags")


def _step_time(spec: str, model, gpu, plan, calibration, args=None):
    check_step_time(spec, calibration)
    if spec.startswith("fixed:"):
        try:
            return FixedStepTime(float(spec.split(":", 1)[1]) / 1e3)
        except ValueError:
            raise ValueError(f"--step-time {spec!r}: expected fixed:MILLISECONDS") from None
    if spec != "analytic":
        raise ValueError(f"--step-time {spec!r}: expected analytic or fixed:MILLISECONDS")
    coeffs = Coefficients.from_calibration(calibration) if calibration else None
    cost = ModelCost.from_model(model, gpu, plan, args)
    source = calibration_source(calibration, cost.arch) if calibration else \
        f"fitted defaults; {MEASURED_ERROR}{prior_only_note(cost.arch)}"
    spec = None
    if plan.speculative is not None and args is not None:
        from poolsim.pools.sizing.speculative import resolve_speculative

        spec = SpecCost.from_plan(resolve_speculative(model, args).draft, gpu, plan, args)
    return AnalyticStepTime(cost, coeffs, source=source, spec=spec)
