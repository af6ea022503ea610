"""SGLang's forward-pass metrics (``--enable-forward-pass-metrics``) as JSONL: one ``ForwardPassMetrics`` per line.

SGLang 0.5.23 publishes one message per forward pass over ZMQ PUB (sglang/srt/observability/forward_pass_metrics.py):
a multipart ``(topic b"", counter as 8 big-endian bytes, msgpack payload)`` (forward_pass_metrics.py:309-313), the
payload a ``ForwardPassMetrics`` struct (:103-126) holding two nested structs, ``ScheduledRequestMetrics`` (:72-85)
and ``QueuedRequestMetrics`` (:88-100), with the field order of ``FIELDS`` below. The structs are declared without
``array_like``, so msgspec writes each as a msgpack map keyed by field name; the class docstring (:115-117) speaks of
positional encoding, which is what Dynamo's consumer declares: ``decode_payload`` reads both, an array by SGLang's
field order, a map by name. ``poolsim record`` writes each message as one JSON object with those names, plus
``timestamp`` (receive time, Unix seconds) and ``endpoint``.

What a message means (sglang/srt/managers/scheduler_components/metrics_reporter.py):
- ``wall_time``: the GPU span of the forward, first kernel start to last end on one stream (FpmTiming,
  forward_pass_metrics.py:141-188), not the scheduler's step cadence: CPU time the overlap scheduler does not hide
  is outside it;
- ``sum_prefill_tokens``: the new (extend) tokens of the batch's prefill requests (``PrefillStats.log_input_tokens``,
  metrics_reporter.py:461), ``sum_prefill_kv_tokens`` their prefix lengths (:464), ``var_prefill_length`` the
  population variance of their prompt lengths (:459, 477);
- ``sum_decode_kv_tokens``: the decode rows' sequence lengths (:466-472; a speculative batch: ``seqlen - 1``, :420-436);
- an idle heartbeat is all zeros with ``wall_time`` 0 (forward_pass_metrics.py:112-113, 297-304).
Lost messages (a full publisher queue or a busy socket drops them, :269-271, 315) show as gaps in ``counter_id``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from poolsim.telemetry.errors import Skips, TelemetryError
from poolsim.telemetry.steps import MeasuredStep, StepSource

FPM_VERSION = 1  # forward_pass_metrics.py:39
SCHEDULED_FIELDS = ("num_prefill_requests", "sum_prefill_tokens", "var_prefill_length", "sum_prefill_kv_tokens",
                    "num_decode_requests", "sum_decode_kv_tokens", "var_decode_kv_tokens")  # :79-85
QUEUED_FIELDS = ("num_prefill_requests", "sum_prefill_tokens", "var_prefill_length", "num_decode_requests",
                 "sum_decode_kv_tokens", "var_decode_kv_tokens")  # :95-100
FIELDS = ("version", "worker_id", "dp_rank", "counter_id", "wall_time", "scheduled_requests",
          "queued_requests")  # :120-126
NESTED = {"scheduled_requests": SCHEDULED_FIELDS, "queued_requests": QUEUED_FIELDS}
FLOATS = {"wall_time", "var_prefill_length", "var_decode_kv_tokens"}
RECORD_EXTRA = ("timestamp", "endpoint")  # what `poolsim record` adds to each message

IDLE = "idle heartbeat (all zeros, wall_time 0)"
NO_SPAN = "no GPU span (wall_time 0 with requests scheduled)"
NOTHING_SCHEDULED = "no request scheduled (an idle or DP-synchronisation forward)"


def decode_payload(payload: bytes) -> dict:
    """A msgpack ``ForwardPassMetrics`` -> a dict with SGLang's field names (nested structs as dicts), checked as a
    JSONL line is. Raises ValueError on a payload that is neither SGLang's map nor its positional array of these
    fields, or holds a value of the wrong type."""
    import msgspec

    try:
        obj = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as e:
        raise ValueError(f"not msgpack ({e})") from None
    return check(_named(obj, FIELDS, "message"))


def _named(obj, names: tuple[str, ...], what: str) -> dict:
    if isinstance(obj, (list, tuple)):  # positional: SGLang's declaration order
        if len(obj) != len(names):
            raise ValueError(f"{what}: {len(obj)} positional fields, SGLang's ForwardPassMetrics has {len(names)}")
        obj = dict(zip(names, obj))
    if not isinstance(obj, dict):
        raise ValueError(f"{what}: expected a msgpack map or array, got {type(obj).__name__}")
    missing = [n for n in names if n not in obj]
    if missing:
        raise ValueError(f"{what}: missing field(s) {', '.join(missing)}")
    out = {n: obj[n] for n in names}
    for key, fields in NESTED.items():
        if key in out:
            out[key] = _named(out[key], fields, key)
    return out


def read_fpm(path: str | Path) -> StepSource:
    """Every line of ``path`` as a MeasuredStep (source ``fpm``); idle heartbeats and span-less messages skipped and
    counted. A line that is not a ForwardPassMetrics record is a TelemetryError naming it."""
    path = Path(path)
    steps: list[MeasuredStep] = []
    skips = Skips()
    last_counter: dict[tuple, int] = {}
    lost = restarts = 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            rec = parse_record(path, number, raw)
            key = (rec["worker_id"], rec["dp_rank"], rec.get("endpoint"))
            prev = last_counter.get(key)
            if prev is not None:
                if rec["counter_id"] > prev + 1:
                    lost += rec["counter_id"] - prev - 1
                elif rec["counter_id"] <= prev:
                    restarts += 1  # a new publisher (server restart) counts from 0 again
            last_counter[key] = rec["counter_id"]
            s, wall = rec["scheduled_requests"], rec["wall_time"]
            busy = s["num_prefill_requests"] or s["num_decode_requests"]
            if wall == 0:
                skips.add(NO_SPAN if busy else IDLE, path, number)
                continue
            if not busy:
                skips.add(NOTHING_SCHEDULED, path, number)
                continue
            steps.append(MeasuredStep(
                "fpm", str(path), number, timestamp=rec["timestamp"], rank=f"dp{rec['dp_rank']}",
                num_prefill_reqs=s["num_prefill_requests"], prefill_tokens=s["sum_prefill_tokens"],
                prefill_prefix_tokens=s["sum_prefill_kv_tokens"], prefill_len_var=s["var_prefill_length"],
                num_decode_reqs=s["num_decode_requests"], decode_kv_tokens=s["sum_decode_kv_tokens"],
                measured_s=wall, queued_reqs=rec["queued_requests"]["num_prefill_requests"]))
    return StepSource(str(path), "fpm", steps, skips, {
        "messages": len(steps) + skips.total, "lost_messages": lost, "publisher_restarts": restarts,
        "ranks": sorted({s.rank for s in steps}), "measured": "GPU span of each forward (FpmTiming)"})


class FieldError(ValueError):
    def __init__(self, field: str, problem: str):
        super().__init__(f"field {field!r}: {problem}")
        self.field, self.problem = field, problem


def check(obj: dict) -> dict:
    """SGLang's fields of one message, each present and typed (FieldError names the first that is not)."""
    rec = {}
    for name in FIELDS:
        if name not in obj:
            raise FieldError(name, "missing (not a ForwardPassMetrics record)")
        rec[name] = _value(name, obj[name])
    if rec["version"] != FPM_VERSION:
        raise FieldError("version", f"{rec['version']}: poolsim reads ForwardPassMetrics version {FPM_VERSION} "
                         "(SGLang 0.5.23)")
    return rec


def parse_record(path: Path, number: int, raw: bytes) -> dict:
    """One JSONL line -> the checked record (every SGLang field present and typed, plus ``timestamp``)."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise TelemetryError(path, number, None, f"invalid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise TelemetryError(path, number, None, f"expected a JSON object, got {type(obj).__name__}")
    try:
        rec = check(obj)
        if "timestamp" not in obj:
            raise FieldError("timestamp", "missing (the receive time `poolsim record` writes)")
        rec["timestamp"] = _number("timestamp", obj["timestamp"])
    except FieldError as e:
        raise TelemetryError(path, number, e.field, e.problem) from None
    rec["endpoint"] = obj.get("endpoint")
    return rec


def _value(name, v):
    if name in NESTED:
        if not isinstance(v, dict):
            raise FieldError(name, f"expected an object, got {type(v).__name__}")
        out = {}
        for sub in NESTED[name]:
            if sub not in v:
                raise FieldError(f"{name}.{sub}", "missing")
            out[sub] = _value(f"{name}.{sub}", v[sub])
        return out
    short = name.rsplit(".", 1)[-1]
    if short == "worker_id":
        if not isinstance(v, str):
            raise FieldError(name, f"must be a string, got {v!r:.40}")
        return v
    if short in FLOATS:
        return _number(name, v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise FieldError(name, f"must be an integer >= 0, got {v!r:.40}")
    return v


def _number(name, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise FieldError(name, f"must be a finite number >= 0, got {v!r:.40}")
    return float(v)
