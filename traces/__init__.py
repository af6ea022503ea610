"""poolsim traces: one Request record, loaders for real formats, generators, and trace statistics."""

from pathlib import Path

from poolsim.traces.errors import RequestError, TraceFormatError
from poolsim.traces.generate import (
    ConstantRate,
    DiurnalRate,
    Empirical,
    Fixed,
    LogNormal,
    StepRate,
    Uniform,
    WorkloadSpec,
    agent_spec,
    arrival_times,
    chat_spec,
    generate,
    parse_length,
    parse_rate,
)
from poolsim.traces.inspect import TraceStats, inspect_trace, mean_rate, shared_prefix_lengths
from poolsim.traces.load import FORMATS, detect_format, load_trace
from poolsim.traces.poolsim_format import write_trace
from poolsim.traces.request import Request, fold_segment_id, segment_tokens
from poolsim.traces.trace import Trace, scale_trace, slice_trace

DEFAULT_TRACE = Path(__file__).parent / "data" / "default.jsonl"

__all__ = [
    "Request", "Trace", "TraceFormatError", "RequestError", "DEFAULT_TRACE",
    "load_trace", "detect_format", "FORMATS", "write_trace", "slice_trace", "scale_trace",
    "fold_segment_id", "segment_tokens",
    "inspect_trace", "TraceStats", "shared_prefix_lengths", "mean_rate",
    "generate", "WorkloadSpec", "chat_spec", "agent_spec", "arrival_times", "parse_length", "parse_rate",
    "ConstantRate", "StepRate", "DiurnalRate", "Fixed", "Uniform", "LogNormal", "Empirical",
]
