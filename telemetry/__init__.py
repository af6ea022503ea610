"""poolsim telemetry: a real SGLang server's own measurements, read, recorded, fitted and compared.

Readers, one per source (each names the file and line of what it cannot use): forward-pass metrics JSONL
(``fpm``), server logs (``server_log``), bench_serving results (``bench_result``); ``record`` subscribes to a
server's forward-pass-metrics endpoints and writes the JSONL; ``fit`` turns measured steps into a calibration file;
``validate`` compares poolsim with the measurements.
"""

from poolsim.telemetry.bench_result import BenchRun, read_bench_results
from poolsim.telemetry.errors import Skips, TelemetryError
from poolsim.telemetry.fpm import decode_payload, read_fpm
from poolsim.telemetry.server_log import ServerLog, read_server_log
from poolsim.telemetry.sources import detect, load_measured
from poolsim.telemetry.steps import MeasuredStep, StepSource, prefill_pairs

__all__ = ["BenchRun", "MeasuredStep", "ServerLog", "Skips", "StepSource", "TelemetryError", "decode_payload",
           "detect", "load_measured", "prefill_pairs", "read_bench_results", "read_fpm", "read_server_log"]
