"""The speed work's safety net: small runs whose every output must stay bit-identical.

Each configuration's step table, request table and summary are hashed, and so is every server's final pool
state (``sim.state_digest``: free-list order, request rows, state slots, every tree node's slots, LRU time and
locks), because slot-id mistakes do not show in counts. The golden hashes were recorded from the code before
any optimisation (commit 6f6ddde); a fast path that moves one of them is wrong. Regenerate with
UPDATE_GOLDEN=1 only when simulated behaviour is meant to change, and say why in the commit.
"""

import hashlib
import json
import os
from pathlib import Path

import pytest

from poolsim.app import run as app_run
from poolsim.app.run import simulate
from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.server_args import ServerArgs
from poolsim.sim.state_digest import pool_state_digest
from poolsim.traces import DEFAULT_TRACE, LogNormal, chat_spec, generate, load_trace, scale_trace, slice_trace

GOLDEN = Path(__file__).parent / "golden" / "reference_equivalence.json"
MOONCAKE = Path(__file__).parents[1] / "traces" / "data" / "mooncake_conversation_head400.jsonl"


def _mooncake(end_s, rate=1.0):
    trace = slice_trace(load_trace(MOONCAKE), 0, end_s)
    return scale_trace(trace, rate) if rate != 1.0 else trace


def _chat(end_s, rate):
    return scale_trace(slice_trace(load_trace(DEFAULT_TRACE), 0, end_s), rate)


def _long_outputs():
    """Chat sessions with long answers: decode outgrows admission's reservation, so small pools retract."""
    return generate(chat_spec(60, rate=3, think_time_s=5, output_len=LogNormal(600, 0.7, 4, 3000)), seed=1)


LLAMA, KIMI = ("llama-3.1-8b", "H100"), ("kimi-linear-48b-a3b", "H200")
# name: (model and gpu, server args, trace, step time); small pools force eviction and retraction
CASES = {
    "llama_page1_overlap_radix": (LLAMA, ServerArgs(max_total_tokens=12_000), _long_outputs, "analytic"),
    "llama_page16_plain_radix": (LLAMA, ServerArgs(page_size=16, max_total_tokens=12_000,
                                                   disable_overlap_schedule=True), _long_outputs, "fixed:20"),
    "llama_page1_plain_noradix": (LLAMA, ServerArgs(disable_radix_cache=True, disable_overlap_schedule=True,
                                                    max_total_tokens=12_000), _long_outputs, "fixed:20"),
    "llama_page16_overlap_noradix": (LLAMA, ServerArgs(disable_radix_cache=True, page_size=16,
                                                       max_total_tokens=12_000), _long_outputs, "fixed:20"),
    "kimi_extra_buffer_overlap": (KIMI, ServerArgs(max_total_tokens=12_000), _long_outputs, "analytic"),
    "kimi_no_buffer_plain": (KIMI, ServerArgs(disable_overlap_schedule=True, mamba_radix_cache_strategy="no_buffer",
                                              max_mamba_cache_size=60, max_total_tokens=12_000),
                             _long_outputs, "fixed:20"),
    "llama_mixed_chunk": (LLAMA, ServerArgs(max_total_tokens=12_000, enable_mixed_chunk=True,
                                            chunked_prefill_size=512), lambda: _chat(120, 8), "fixed:20"),
    "llama_page16_overlap_mooncake": (LLAMA, ServerArgs(page_size=16, max_total_tokens=40_000),
                                      lambda: _mooncake(30, 3), "fixed:30"),
    "llama_lpm_mooncake": (LLAMA, ServerArgs(max_total_tokens=40_000, schedule_policy="lpm",
                                             chunked_prefill_size=2048), lambda: _mooncake(30, 3), "fixed:30"),
    "kimi_extra_buffer_mooncake": (KIMI, ServerArgs(max_total_tokens=40_000, max_mamba_cache_size=30),
                                   lambda: _mooncake(30, 3), "fixed:30"),
    "llama_dp2_cache_aware": (LLAMA, ServerArgs(dp_size=2, max_total_tokens=12_000), lambda: _chat(120, 4),
                              "fixed:20"),
}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def run_case(name: str, monkeypatch, check: bool = False) -> dict:
    (model, gpu), args, make_trace, step_time = CASES[name]
    servers = []
    build = app_run.build_server

    def capture(*a, **kw):
        servers.append(build(*a, **kw))
        return servers[-1]

    monkeypatch.setattr(app_run, "build_server", capture)
    trace = make_trace()
    router = "cache_aware" if args.dp_size > 1 else "round_robin"
    r = simulate(trace, ModelConfig.load(model), get_gpu(gpu), args, step_time=step_time, router=router,
                 check=check)
    width = max(t.input_len + t.output_len for t in trace) + 2
    return {
        "steps": len(r.steps), "requests": len(r.requests), "retractions": int(r.summary["retractions"]),
        "evicted_tokens": int(r.summary["evicted_tokens"]),
        "step_table": _sha(r.steps.to_csv(index=False)),
        "request_table": _sha(r.requests.to_csv(index=False)),
        "summary": _sha(json.dumps(r.summary, sort_keys=True, default=str)),
        "pool_state": [pool_state_digest(s, width) for s in servers],
    }


@pytest.mark.parametrize("name", list(CASES))
def test_outputs_and_pool_state_match_the_reference(name, monkeypatch):
    got = run_case(name, monkeypatch)
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if os.environ.get("UPDATE_GOLDEN"):
        golden[name] = got
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    assert got == golden[name]


@pytest.mark.parametrize("name", ["llama_mixed_chunk", "kimi_extra_buffer_mooncake"])
def test_check_mode_gives_the_same_outputs(name, monkeypatch):
    """``--check`` (double-free checks in the free lists, invariants after every step) changes no output."""
    assert run_case(name, monkeypatch, check=True) == json.loads(GOLDEN.read_text())[name]


def test_the_cases_exercise_retraction_and_eviction():
    """The net only catches what the runs do: under these pools they retract and evict."""
    golden = json.loads(GOLDEN.read_text())
    assert golden.keys() == CASES.keys()
    assert sum(g["retractions"] > 0 for g in golden.values()) >= 4
    assert all(g["evicted_tokens"] > 0 for n, g in golden.items() if "noradix" not in n)
