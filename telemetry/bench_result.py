"""bench_serving result files (``python -m sglang.bench_serving --output-file F [--output-details]``): JSONL, one
result dict per run, appended (sglang/benchmark/serving.py:1960-1966).

A line is ``benchmark()``'s result dict (serving.py:1855-1907): the arguments that describe the workload
(``dataset_name``, ``request_rate`` (``"trace"`` for timestamped traces), ``max_concurrency``,
``sharegpt_output_len``, ``random_input_len``, ``random_output_len``, ``random_range_ratio``) and the measured
numbers (``duration``, ``completed``, token totals, throughputs, mean/median/std/p90/p95/p99 of e2e latency, TTFT,
TPOT and ITL in ms, ``concurrency``, ``accept_length``). With ``--output-details`` it adds per request
(serving.py:1945-1952): ``input_lens`` (the prompt length the client counted), ``output_lens`` (0 for a failed
request), ``ttfts`` (s), ``itls`` (s, per token), ``generated_texts`` and ``errors``.

The dict does not hold ``--num-prompts`` or ``--seed``: the prompt count is the length of ``input_lens`` when the
details are there, else ``completed`` (the successful requests: fewer than the prompts when some failed, which the
file cannot say), and the seed is not recorded (``seed`` is None: ``poolsim validate --seed`` supplies it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from poolsim.telemetry.errors import TelemetryError

WORKLOAD = ("dataset_name", "request_rate", "max_concurrency", "sharegpt_output_len", "random_input_len",
            "random_output_len", "random_range_ratio")
METRICS = ("duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
           "input_throughput", "output_throughput", "total_throughput", "concurrency", "accept_length",
           *(f"{s}_{m}_ms" for m in ("e2e_latency", "ttft", "tpot", "itl")
             for s in ("mean", "median", "std", "p90", "p95", "p99")))
REQUIRED = ("dataset_name", "request_rate", "completed", "duration", "output_throughput", "median_ttft_ms")
DETAILS = ("input_lens", "output_lens", "ttfts", "itls", "errors")


class BenchRun:
    """One bench_serving run: ``workload`` (the arguments it recorded, None where it did not), ``measured`` (the
    metrics it holds, not those written as null), ``missing`` (metric names the line does not have), ``details``
    (the per-request lists, or None)."""

    def __init__(self, path: str, line: int, workload: dict, measured: dict, missing: list[str],
                 details: dict | None, server_info):
        self.path, self.line, self.workload, self.measured = path, line, workload, measured
        self.missing, self.details, self.server_info = missing, details, server_info

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def read_bench_results(path: str | Path) -> list[BenchRun]:
    path = Path(path)
    runs = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if raw.strip():
                runs.append(parse_run(path, number, raw))
    if not runs:
        raise TelemetryError(path, None, None, "no bench_serving result in the file")
    return runs


def parse_run(path: Path, number: int, raw: bytes) -> BenchRun:
    try:
        obj = json.loads(raw)  # bench_serving's json.dumps writes inf as Infinity, which json reads back
    except (ValueError, RecursionError) as e:
        raise TelemetryError(path, number, None, f"invalid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise TelemetryError(path, number, None, f"expected a JSON object, got {type(obj).__name__}")
    for key in REQUIRED:
        if key not in obj:
            raise TelemetryError(path, number, key, "missing (not a bench_serving result)")

    def err(key, problem):
        return TelemetryError(path, number, key, problem)

    workload = {k: obj.get(k) for k in WORKLOAD}
    if not isinstance(workload["dataset_name"], str):
        raise err("dataset_name", f"must be a string, got {workload['dataset_name']!r:.40}")
    rate = workload["request_rate"]
    if rate != "trace" and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0):
        raise err("request_rate", f"must be a rate > 0, Infinity or \"trace\", got {rate!r:.40}")
    for key in ("max_concurrency", "sharegpt_output_len", "random_input_len", "random_output_len"):
        v = workload[key]
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise err(key, f"must be an integer >= 1 or null, got {v!r:.40}")
    r = workload["random_range_ratio"]
    if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r <= 1):
        raise err("random_range_ratio", f"must lie in [0, 1], got {r!r:.40}")
    measured, missing = {}, []
    for key in METRICS:
        if key not in obj:
            missing.append(key)
            continue
        v = obj[key]
        if v is None:  # written as null (accept_length without speculative decoding): nothing measured
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise err(key, f"must be a finite number >= 0, got {v!r:.40}")
        measured[key] = float(v)
    if measured["completed"] != int(measured["completed"]):
        raise err("completed", f"must be a count, got {obj['completed']!r}")
    details = _details(obj, err) if any(k in obj for k in DETAILS) else None
    workload["num_prompts"] = len(details["input_lens"]) if details else int(measured["completed"])
    workload["num_prompts_from"] = "input_lens" if details else "completed (the result has no num_prompts)"
    workload["seed"] = obj.get("seed")  # bench_serving 0.5.23 does not write it
    for key in ("backend", "tag"):
        workload[key] = obj.get(key)
    return BenchRun(str(path), number, workload, measured, missing, details, obj.get("server_info"))


def _details(obj: dict, err) -> dict:
    for key in DETAILS:
        if key not in obj:
            raise err(key, "missing: the file has some --output-details lists but not this one")
        if not isinstance(obj[key], list):
            raise err(key, f"must be a list, got {type(obj[key]).__name__}")
    n = len(obj["input_lens"])
    for key in DETAILS:
        if len(obj[key]) != n:
            raise err(key, f"{len(obj[key])} entries, input_lens has {n}")
    for key in ("input_lens", "output_lens"):
        for i, v in enumerate(obj[key]):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise err(f"{key}[{i}]", f"must be an integer >= 0, got {v!r:.40}")
    for i, v in enumerate(obj["ttfts"]):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise err(f"ttfts[{i}]", f"must be seconds >= 0, got {v!r:.40}")
    for i, v in enumerate(obj["itls"]):
        if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in v):
            raise err(f"itls[{i}]", "must be a list of seconds")
    ok = [not e for e in obj["errors"]]
    return {"input_lens": obj["input_lens"], "output_lens": obj["output_lens"], "ttfts": obj["ttfts"],
            "itls": obj["itls"], "ok": ok}
