"""``poolsim bench``: SGLang 0.5.23's ``bench_serving`` client against a simulated server.

One invocation of bench_serving (``benchmark()`` in sglang/benchmark/serving.py) is a ``BenchConfig``: warm-up
requests (copies of the first prompt asking min(output, 32) tokens, through the same concurrency limit), then an
optional ``/flush_cache``, then a 1 s sleep, then the measured requests at their drawn send times, at most
``max_concurrency`` in flight. Several configs run back to back on one warm server: the prefix cache carries
over unless a run flushes it. Metrics are ``calculate_metrics``'s, defined in reports/METRICS.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from poolsim.sim.engine import Barrier
from poolsim.traces.bench_serving import DEFAULT_SEED, bench_requests, warmup_requests

WARMUP_PAUSE_S = 1.0  # benchmark(): await asyncio.sleep(1.0) after the warm-up (and flush)
PERCENTILES = (90, 95, 99)


@dataclass(frozen=True)
class BenchConfig:
    """One bench_serving invocation, its flags by their bench_serving names."""

    dataset_name: str = "random-ids"  # bench_serving defaults to sharegpt, which needs a file
    num_prompts: int = 1000
    random_input_len: int = 1024
    random_output_len: int = 1024
    random_range_ratio: float = 0.0
    request_rate: float = math.inf
    max_concurrency: int | None = None
    seed: int = DEFAULT_SEED
    warmup_requests: int = 1
    flush_cache: bool = False
    dataset_path: str | None = None
    sharegpt_output_len: int | None = None
    sharegpt_context_len: int | None = None
    burstiness: float = 1.0
    range_style: str = "sglang"
    sharegpt_standin: bool = False  # random without a ShareGPT file: stand-in texts (traces/bench_serving.py)

    def requests(self, rid_base: int, vocab_size: int | None):
        return bench_requests(self.dataset_name, self.num_prompts, input_len=self.random_input_len,
                              output_len=self.random_output_len, range_ratio=self.random_range_ratio,
                              seed=self.seed, request_rate=self.request_rate, burstiness=self.burstiness,
                              sharegpt_path=self.dataset_path, sharegpt_output_len=self.sharegpt_output_len,
                              sharegpt_context_len=self.sharegpt_context_len, vocab_size=vocab_size,
                              range_style=self.range_style, rid_base=rid_base,
                              sharegpt_standin=self.sharegpt_standin)


def bench_configs(rates: list[float], limits: list[int | None], **flags) -> list[BenchConfig]:
    """One invocation per request rate and concurrency limit, back to back: the two lists pair up element by
    element, and a single value goes with every value of the other list. ``flags``: BenchConfig's other fields."""
    n = max(len(rates), len(limits))
    if {len(rates), len(limits)} - {1, n}:
        raise ValueError("--request-rate and --max-concurrency lists must have one value or the same length")
    return [BenchConfig(request_rate=rates[i % len(rates)], max_concurrency=limits[i % len(limits)], **flags)
            for i in range(n)]


def bench_trace(configs: list[BenchConfig], vocab_size: int | None = None):
    """The client's whole timeline as one trace: (items with Barriers, [(run's rids, its start barrier index)])."""
    if any(c.warmup_requests < 0 for c in configs):
        raise ValueError("--warmup-requests must be >= 0")
    items, runs, rid, barriers = [], [], 0, 0
    for k, cfg in enumerate(configs):
        if cfg.max_concurrency is not None and cfg.max_concurrency < 1:
            raise ValueError(f"--max-concurrency {cfg.max_concurrency}: must be >= 1")
        measured = cfg.requests(rid + cfg.warmup_requests, vocab_size)
        if k:
            items.append(Barrier(0.0, False, cfg.max_concurrency))  # the next invocation starts after this one
            barriers += 1
        items += warmup_requests(measured[0], cfg.warmup_requests, rid)
        items.append(Barrier(WARMUP_PAUSE_S, cfg.flush_cache))
        runs.append(([r.rid for r in measured], barriers))
        barriers += 1
        items += measured
        rid = measured[-1].rid + 1
    return items, runs


def run_bench(configs: list[BenchConfig], model, gpu, args, *, step_time: str = "analytic",
              calibration: str | None = None, runtime_overhead_gib: float | None = None, router: str = "round_robin",
              vocab_size: int | None = None, progress=None):
    """Simulate the runs back to back on one server; (RunResult, [metrics dict per run]). ``vocab_size``: the
    tokenizer's, for random-ids (default: the model config's, which can exceed the tokenizer's base vocabulary,
    e.g. Llama 3: 128256 vs 128000; the ids differ, their chance of sharing a prefix hardly). ``progress(done,
    t)``: simulate's."""
    from poolsim.app.run import simulate

    items, runs = bench_trace(configs, vocab_size or getattr(model, "vocab_size", None))
    result = simulate(items, model, gpu, args, step_time=step_time, calibration=calibration,
                      runtime_overhead_gib=runtime_overhead_gib, router=router,
                      max_concurrency=configs[0].max_concurrency, token_times=True, progress=progress,
                      seed=configs[0].seed,
                      trace_info={"name": "bench_serving", "requests": sum(len(r) for r, _ in runs)})
    starts = result.run["phase_starts_s"]
    metrics = []
    for cfg, (rids, barrier) in zip(configs, runs):
        reqs = result.requests[result.requests["rid"].isin(rids)]
        m = calculate_metrics(reqs, result.token_times, starts[barrier])
        if result.spec_samplers is not None:
            m.update(_speculative_metrics(result, max(rids)))
        metrics.append({**_arguments(cfg), **m})
    return result, metrics


def _speculative_metrics(result, last_rid: int) -> dict:
    """bench_serving's ``accept_length`` (the server's average accept length when the run ends,
    sglang/benchmark/serving.py:1650-1662) and poolsim's own of the whole simulation (reports/METRICS.md)."""
    from poolsim.sim.speculative import accept_length_through

    s = result.summary
    return {"accept_length": accept_length_through(result.spec_samplers, last_rid),
            "spec_accept_length_expected": s["speculative_accept_length_expected"],
            "spec_tokens_per_step": s["speculative_tokens_per_step"],
            "spec_draft_overhead": s["speculative_draft_overhead"]}


def _arguments(cfg: BenchConfig) -> dict:
    a = asdict(cfg)
    return {"backend": "sglang (simulated by poolsim)", "dataset_name": a["dataset_name"],
            "request_rate": a["request_rate"], "max_concurrency": a["max_concurrency"],
            "sharegpt_output_len": a["sharegpt_output_len"], "random_input_len": a["random_input_len"],
            "random_output_len": a["random_output_len"], "random_range_ratio": a["random_range_ratio"]}


def _stats(name: str, values: list[float]) -> dict:
    """bench_serving's mean/median/std/p90/p95/p99 in ms (``np.x(values or 0)``: 0 when there are none)."""
    v = values or 0
    out = {f"mean_{name}_ms": float(np.mean(v)) * 1000, f"median_{name}_ms": float(np.median(v)) * 1000,
           f"std_{name}_ms": float(np.std(v)) * 1000}
    out.update({f"p{q}_{name}_ms": float(np.percentile(v, q)) * 1000 for q in PERCENTILES})
    return out


def calculate_metrics(requests: pd.DataFrame, token_times: dict, start_s: float) -> dict:
    """``calculate_metrics`` of one run: ``requests`` rows as sim.metrics.Recorder writes them (``arrival_s`` is
    the send time), ``token_times`` rid -> output token times, ``start_s`` the run's first send
    (``benchmark_start_time``). Aborted requests are bench_serving's failed ones (no output, not counted)."""
    ok = requests[~requests["aborted"].astype(bool)]
    ttfts, tpots, itls, e2es = [], [], [], []
    for rid, send, first, finish, out in zip(ok["rid"], ok["arrival_s"], ok["first_token_s"], ok["finish_s"],
                                             ok["output_len"]):
        ttfts.append(first - send)
        e2es.append(finish - send)
        if out > 1:
            tpots.append((finish - first) / (out - 1))
        itls += _itls(token_times.get(rid, []))
    end = float(requests["finish_s"].max()) if len(requests) else start_s
    dur = end - start_s
    completed, total_input, total_output = len(ok), int(ok["input_len"].sum()), int(ok["output_len"].sum())
    peak_tok_s, peak_conc = _peaks(ok, token_times)
    m = {"duration": dur, "completed": completed, "total_input_tokens": total_input,
         "total_output_tokens": total_output, "total_output_tokens_retokenized": total_output,
         "request_throughput": completed / dur, "input_throughput": total_input / dur,
         "output_throughput": total_output / dur, "total_throughput": (total_input + total_output) / dur}
    m.update(_stats("e2e_latency", e2es))
    m.update(_stats("ttft", ttfts))
    m.update(_stats("tpot", tpots))
    m.update(_stats("itl", itls))
    m["max_itl_ms"] = float(np.max(itls or 0)) * 1000
    m["concurrency"] = float(np.sum(e2es)) / dur
    m["max_output_tokens_per_s"], m["max_concurrent_requests"] = peak_tok_s, peak_conc
    return m


def _itls(times: list[float]) -> list[float]:
    """bench_serving's inter-token latencies of one streamed request (sglang/benchmark/serving.py:780-797): after
    the first chunk, each chunk's gap is spread over the tokens it carries (a speculative step streams its accepted
    run as one chunk); one token per chunk makes them the gaps between tokens."""
    out: list[float] = []
    i = 1
    while i < len(times) and times[i] == times[0]:  # the first chunk's other tokens
        i += 1
    prev = times[0] if times else 0.0
    while i < len(times):
        j = i
        while j < len(times) and times[j] == times[i]:
            j += 1
        gap = (times[i] - prev) / (j - i)
        out += [gap] * (j - i)
        prev = times[i]
        i = j
    return out


def _peaks(ok: pd.DataFrame, token_times: dict) -> tuple[float, int]:
    """Peak output tokens in one whole second and peak requests in flight per second, bucketed from the first
    send as calculate_metrics does."""
    if ok.empty:
        return 0.0, 0
    t0 = float(ok["arrival_s"].min())
    buckets = int(np.ceil(float(ok["finish_s"].max()) - t0)) + 1
    tokens, conc = np.zeros(buckets), np.zeros(buckets)
    for rid, send, finish in zip(ok["rid"], ok["arrival_s"], ok["finish_s"]):
        idx = (np.asarray(token_times.get(rid, []), dtype=float) - t0).astype(int)
        np.add.at(tokens, idx[(idx >= 0) & (idx < buckets)], 1)
        conc[int(send - t0):min(int(finish - t0) + 1, buckets)] += 1
    return float(tokens.max()), int(conc.max())


def format_result(m: dict) -> str:
    """The result block bench_serving prints, in its words and formats."""
    rows = [("Backend:", m["backend"]), ("Traffic request rate:", m["request_rate"]),
            ("Max request concurrency:", m["max_concurrency"] or "not set"),
            ("Successful requests:", m["completed"]), ("Benchmark duration (s):", f"{m['duration']:.2f}"),
            ("Total input tokens:", m["total_input_tokens"]), ("Total input text tokens:", m["total_input_tokens"]),
            ("Total generated tokens:", m["total_output_tokens"]),
            ("Total generated tokens (retokenized):", m["total_output_tokens_retokenized"]),
            ("Request throughput (req/s):", f"{m['request_throughput']:.2f}"),
            ("Input token throughput (tok/s):", f"{m['input_throughput']:.2f}"),
            ("Output token throughput (tok/s):", f"{m['output_throughput']:.2f}"),
            ("Peak output token throughput (tok/s):", f"{m['max_output_tokens_per_s']:.2f}"),
            ("Peak concurrent requests:", m["max_concurrent_requests"]),
            ("Total token throughput (tok/s):", f"{m['total_throughput']:.2f}"),
            ("Concurrency:", f"{m['concurrency']:.2f}")]
    if m.get("accept_length"):  # bench_serving prints it when the server reports one
        rows.append(("Accept length:", f"{m['accept_length']:.2f}"))
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]
    lines += ["{:<40} {:<10}".format(k, str(v)) for k, v in rows]
    sections = [("End-to-End Latency", "e2e_latency", "E2E Latency"), ("Time to First Token", "ttft", "TTFT"),
                ("Time per Output Token (excl. 1st token)", "tpot", "TPOT"), ("Inter-Token Latency", "itl", "ITL")]
    for title, key, label in sections:
        lines.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        for stat, word in (("mean", "Mean"), ("median", "Median"), ("p90", "P90"), ("p95", "P95"), ("p99", "P99")):
            lines.append("{:<40} {:<10.2f}".format(f"{word} {label} (ms):", m[f"{stat}_{key}_ms"]))
        if key == "itl":
            lines.append("{:<40} {:<10.2f}".format("Max ITL (ms):", m["max_itl_ms"]))
    lines.append("=" * 50)
    return "\n".join(lines)
