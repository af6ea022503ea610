"""SGLang server logs: ``Prefill batch`` / ``Decode batch`` lines and the startup lines that state sizes.

A line is ``[YYYY-MM-DD HH:MM:SS(.mmm)( DPn)( PPn)( ATTN_CPn)( MOE_DPn)( TPn)( EPn)] message`` (the format of
sglang/srt/utils/common.py:2629-2636, milliseconds with SGLANG_LOG_MS; the rank prefix of
sglang/srt/managers/scheduler.py:6279-6291), found anywhere in the line (docker, Ray and journald put their own
prefixes in front). The batch lines of 0.4-0.5.x: ``Decode batch. #running-req: ...`` (0.4) or ``Decode batch,
#running-req: ...`` (0.5; ``Decode batch [ITER], ...`` with SGLANG_LOG_FORWARD_ITERS), then ``key: value`` pairs
separated by ``, ``. Which pairs appear drifts with the version and the model: ``#token`` / ``token usage`` for one
pool, ``#full token`` / ``full token usage`` / ``#swa token`` / ``swa token usage`` / ``mamba num`` / ``mamba usage``
for hybrid pools (pool_stats_observer.py:104-145), ``accept len`` when speculative (metrics_reporter.py:1005),
``cuda graph`` since 0.4.x (:1040). Pairs poolsim does not use are kept unread; a pair it needs and does not find
makes the line unusable (a skip naming the field), never a guessed value.

Decode step time. SGLang logs a decode line every ``--decode-log-interval`` decode steps (default 40,
sglang/srt/arg_groups/fields/observability.py:136-139; metrics_reporter.py:934) with ``gen throughput`` = tokens
generated since the previous decode line / seconds since it (:942-944; tokens: each step's batch size, times its
accepted tokens per request when speculative, batch_result_processor.py:983-984 and metrics_reporter.py:543-555,
973). With a batch of R requests throughout the interval one step takes R x accept len / gen throughput. That holds
only when nothing else ran and R did not change, so a decode line is marked (and not fitted) when:
- ``first interval``: no earlier decode line of this rank since the server started (the interval's start is unknown);
- ``prefill in interval``: a Prefill batch line of this rank lies between it and the previous decode line (the
  interval's seconds include that prefill, and new requests joined);
- ``draining``: fewer running requests than at the previous decode line (requests finished inside the interval);
- ``batch changed``: more running requests without a prefill line (a retracted request resumed);
- ``saturated``: ``#queue-req`` > 0 (requests wait while this batch runs: the server is at its memory or request
  limit, and retraction or prefill can change the batch at any step);
- ``speculative``: an ``accept len`` line; its time is right, but the step-time model prices a plain decode step,
  not a draft-and-verify one.
The decode rows' KV tokens: the line's ``#token`` (``#full token`` for hybrid pools) is the pool's used tokens at the
interval's end; over the interval they average ``#token - R x accept len x (interval - 1) / 2``. A prefix that
several running requests share is one set of pool tokens, so with shared prompts this is below the sum of their
sequence lengths (what attention reads); forward-pass metrics carry that sum.

Prefill lines give no step time: their ``input throughput`` is over the seconds since the previous prefill line
(metrics_reporter.py:733-740), which holds every decode step in between; they are counted and mark decode intervals.

Startup lines (``sizes``): ``max_total_num_tokens=..., chunked_prefill_size=..., max_prefill_tokens=...,
max_running_requests=..., context_len=..., available_gpu_mem=... GB`` (scheduler.py:1268-1276), ``KV Cache is
allocated. dtype: ..., #tokens: N, K size: X GB, V size: Y GB`` (or ``KV size``; memory_pool.py:2087-2098),
``Mamba Cache is allocated. max_mamba_cache_size: N, conv_state size: XGB, ssm_state size: YGB``
(memory_pool.py:1004-1009), ``Load weight end. ... avail mem=X GB, mem usage=Y GB.`` (model_runner.py:1372-1379),
and ``FPM: ZMQ PUB bound on ENDPOINT (dp_rank=N)`` (metrics_reporter.py:414-418).
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

from poolsim.telemetry.errors import Skips, TelemetryError
from poolsim.telemetry.steps import MeasuredStep, StepSource

DECODE_LOG_INTERVAL = 40  # --decode-log-interval default (observability.py:136-139)
HEADER = re.compile(r"\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?P<ms>\.\d{3})?(?P<prefix>(?: [A-Z_]+\d+)*)\] "
                    r"(?P<msg>.*)$")
BATCH = re.compile(r"^(?P<kind>Prefill|Decode) batch(?: \[(?P<iter>\d+)\])?[.,] (?P<body>.*)$")
STARTUP = re.compile(r"^max_total_num_tokens=")
KV_ALLOCATED = re.compile(r"^(?:(?P<label>.+?) )?KV Cache is allocated\. (?P<body>.*)$")
MAMBA_ALLOCATED = re.compile(r"^Mamba Cache is allocated\. (?P<body>.*)$")
LOAD_WEIGHT = re.compile(r"^Load weight end\. (?P<body>.*)$")
FPM_BOUND = re.compile(r"^FPM: ZMQ PUB bound on (?P<endpoint>\S+) \(dp_rank=(?P<dp>\d+)\)")
GB = re.compile(r"^(?P<v>[0-9.]+) ?GB\.?$")

GRAPH_KEYS = ("cuda graph", "cpu graph", "npu graph", "musa graph")  # metrics_reporter.py:286-290
KV_KEYS = ("#full token", "#token")  # the decode rows' pool, in order of preference (hybrid pools: the full one)
NO_STEP_TIME = "prefill line: the log gives no step time for it (input throughput spans the decode steps since " \
               "the previous prefill line)"


class ServerLog(StepSource):
    """A server log's decode steps (``steps``), what it skipped, and ``sizes``: one dict per server start."""

    def __init__(self, path, steps, skips, notes, sizes: list[dict]):
        super().__init__(path, "server-log", steps, skips, notes)
        self.sizes = sizes


def _pairs(body: str) -> dict[str, str]:
    out = {}
    for part in body.split(", "):
        key, sep, value = part.strip().rstrip(",").partition(": ")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _int(fields: dict, key: str) -> int:
    v = fields[key]
    if not re.fullmatch(r"\d+", v):
        raise ValueError(f"{key!r} is {v!r}, not a count")
    return int(v)


def _float(fields: dict, key: str) -> float:
    try:
        return float(fields[key])
    except ValueError:
        raise ValueError(f"{key!r} is {fields[key]!r}, not a number") from None


def _timestamp(m: re.Match) -> float:
    t = datetime.datetime.strptime(m["ts"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    return t.timestamp() + (float(m["ms"]) if m["ms"] else 0.0)


def _gb(v: str) -> float | None:
    m = GB.match(v.strip())
    return float(m["v"]) if m else None


def _startup(msg: str) -> dict:
    out = {}
    for part in msg.split(", "):
        key, sep, value = part.partition("=")
        if not sep:
            continue
        value = value.strip()
        if re.fullmatch(r"-?\d+", value):
            out[key.strip()] = int(value)
        elif value == "None":
            out[key.strip()] = None
        elif _gb(value) is not None:
            out[key.strip() + "_gb"] = _gb(value)
    return out


def read_server_log(path: str | Path, decode_log_interval: int = DECODE_LOG_INTERVAL) -> ServerLog:
    """The decode lines of ``path`` as MeasuredSteps (source ``server-log``), marked as the module docstring says;
    prefill lines counted; a batch line that does not parse is skipped under its reason with its line."""
    if decode_log_interval < 1:
        raise ValueError(f"--decode-log-interval {decode_log_interval}: must be >= 1")
    path = Path(path)
    steps: list[MeasuredStep] = []
    skips = Skips()
    sizes: list[dict] = []
    state: dict[str, dict] = {}  # rank prefix -> the previous decode line and whether a prefill came since
    counts = {"decode_lines": 0, "prefill_lines": 0}
    endpoints: list[str] = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise TelemetryError(path, number, None, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
            m = HEADER.search(line)
            if m is None:
                if "Decode batch" in line or "Prefill batch" in line:
                    skips.add("batch line without SGLang's [date time] header", path, number)
                continue
            msg, rank = m["msg"], m["prefix"].strip() or "-"
            b = BATCH.match(msg)
            if b is None:
                if STARTUP.match(msg):
                    _group(sizes, number).update({"summary_line": number, **_startup(msg)})
                    state.clear()  # a new server start: no decode interval spans it
                elif k := KV_ALLOCATED.match(msg):
                    kv = _pairs(k["body"])
                    entry = {"line": number, "label": k["label"], "dtype": kv.get("dtype")}
                    if kv.get("#tokens", "").isdigit():
                        entry["tokens"] = int(kv["#tokens"])
                    for key in ("K size", "V size", "KV size"):
                        if key in kv:
                            entry[key.lower().replace(" ", "_") + "_gb"] = _gb(kv[key])
                    _group(sizes, number).setdefault("kv_cache", []).append(entry)
                elif mm := MAMBA_ALLOCATED.match(msg):
                    parts = _pairs(re.sub(r"GB ", "GB, ", mm["body"]))
                    entry = {"line": number}
                    if parts.get("max_mamba_cache_size", "").isdigit():
                        entry["max_mamba_cache_size"] = int(parts["max_mamba_cache_size"])
                    for key in ("conv_state size", "ssm_state size"):
                        if key in parts:
                            entry[key.replace(" size", "") + "_gb"] = _gb(parts[key])
                    _group(sizes, number)["mamba_cache"] = entry
                elif lw := LOAD_WEIGHT.match(msg):
                    w = {k.strip(): v for k, _, v in (p.partition("=") for p in lw["body"].split(", "))}
                    _group(sizes, number)["weights"] = {
                        "line": number, "type": w.get("type"), "avail_mem_gb": _gb(w.get("avail mem", "")),
                        "mem_usage_gb": _gb(w.get("mem usage", ""))}
                elif fb := FPM_BOUND.match(msg):
                    endpoints.append(fb["endpoint"])
                continue
            fields = _pairs(b["body"])
            if b["kind"] == "Prefill":
                counts["prefill_lines"] += 1
                state.setdefault(rank, {"prev": None, "prefill": False})["prefill"] = True
                skips.add(NO_STEP_TIME, path, number)
                continue
            counts["decode_lines"] += 1
            step = _decode_step(path, number, m, rank, fields, state.setdefault(rank, {"prev": None, "prefill": False}),
                                decode_log_interval, skips)
            if step is not None:
                steps.append(step)
    notes = {**counts, "decode_log_interval": decode_log_interval, "ranks": sorted(state),
             "fpm_endpoints": endpoints, "measured": f"mean decode step over each {decode_log_interval}-step "
                                                    "logging interval (wall clock)"}
    return ServerLog(str(path), steps, skips, notes, sizes)


def _group(sizes: list[dict], number: int) -> dict:
    """The sizes of the server start this line belongs to: the model runner logs its pools before the scheduler's
    ``max_total_num_tokens=`` line, which closes the start; a size line after it opens the next one."""
    if not sizes or "max_total_num_tokens" in sizes[-1]:
        sizes.append({"line": number})
    return sizes[-1]


def _decode_step(path, number, m, rank, fields, st, interval, skips) -> MeasuredStep | None:
    kv_key = next((k for k in KV_KEYS if k in fields), None)
    need = ["#running-req", "gen throughput (token/s)", "#queue-req"]
    missing = [k for k in need if k not in fields] + ([] if kv_key else ["#token"])
    if missing:
        skips.add(f"decode line without {missing[0]!r}", path, number)
        return None
    try:
        running, queue = _int(fields, "#running-req"), _int(fields, "#queue-req")
        kv_end, throughput = _int(fields, kv_key), _float(fields, "gen throughput (token/s)")
        accept = _float(fields, "accept len") if "accept len" in fields else None
    except ValueError as e:
        skips.add(f"decode line with an unreadable value ({str(e).split(' is ')[0]})", path, number)
        return None
    graph = next((fields[k] for k in GRAPH_KEYS if k in fields), None)
    prev, prefill = st["prev"], st["prefill"]
    st["prev"], st["prefill"] = running, False
    if running == 0 or throughput <= 0:
        skips.add("decode line with no running request or zero gen throughput", path, number)
        return None
    marks = []
    if prev is None:
        marks.append("first interval")
    if prefill:
        marks.append("prefill in interval")
    if prev is not None and running < prev:
        marks.append("draining")
    elif prev is not None and running > prev and not prefill:
        marks.append("batch changed")
    if queue > 0:
        marks.append("saturated")
    if accept is not None:
        marks.append("speculative")
    per_req = accept if accept is not None else 1.0
    kv_mean = max(kv_end - running * per_req * (interval - 1) / 2, float(running))
    return MeasuredStep("server-log", str(path), number, timestamp=_timestamp(m), rank=rank,
                        num_decode_reqs=running, decode_kv_tokens=kv_mean,
                        measured_s=running * per_req / throughput, marks=tuple(marks),
                        cuda_graph=None if graph is None else graph == "True", queued_reqs=queue)
