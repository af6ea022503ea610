"""``--measured FILE...``: which reader a file needs, told from its first non-blank line."""

from __future__ import annotations

import json
from pathlib import Path

from poolsim.telemetry.bench_result import BenchRun, read_bench_results
from poolsim.telemetry.errors import TelemetryError
from poolsim.telemetry.fpm import read_fpm
from poolsim.telemetry.server_log import DECODE_LOG_INTERVAL, read_server_log
from poolsim.telemetry.steps import StepSource

FORMATS = ("fpm", "server-log", "bench-serving")


def detect(path: str | Path) -> str:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            first, number = b"", 0
            for number, raw in enumerate(f, 1):
                if raw.strip():
                    first = raw.strip().removeprefix(b"\xef\xbb\xbf")
                    break
    except OSError as e:
        raise TelemetryError(path, None, None, f"cannot read ({e.strerror})") from None
    if not first:
        raise TelemetryError(path, None, None, "empty file")
    if not first.startswith(b"{"):
        return "server-log"
    try:
        obj = json.loads(first)
    except ValueError as e:
        raise TelemetryError(path, number, None, f"a JSON line that does not parse: {e}") from None
    if isinstance(obj, dict) and "wall_time" in obj and "scheduled_requests" in obj:
        return "fpm"
    if isinstance(obj, dict) and "completed" in obj and "dataset_name" in obj:
        return "bench-serving"
    raise TelemetryError(path, number, None, "a JSON line that is neither a ForwardPassMetrics record (wall_time, "
                         "scheduled_requests) nor a bench_serving result (dataset_name, completed)")


def load_measured(paths, decode_log_interval: int = DECODE_LOG_INTERVAL) -> tuple[list[StepSource], list[BenchRun]]:
    """Step sources (forward-pass metrics, server logs) and bench_serving runs, in the order given."""
    steps, runs = [], []
    for p in paths:
        kind = detect(p)
        if kind == "fpm":
            steps.append(read_fpm(p))
        elif kind == "bench-serving":
            runs += read_bench_results(p)
        else:
            log = read_server_log(p, decode_log_interval)
            if not log.notes["decode_lines"] and not log.notes["prefill_lines"] and not log.sizes:
                raise TelemetryError(p, None, None, "no `Decode batch` / `Prefill batch` line and no startup line: "
                                     "not an SGLang server log")
            steps.append(log)
    return steps, runs
