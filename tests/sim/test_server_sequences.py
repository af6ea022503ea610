"""bench/data/server_sequences.csv: which published runs shared one warm server, and the cache hits it implies."""

import csv
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _time_accuracy():
    spec = importlib.util.spec_from_file_location("time_accuracy", BENCH / "time_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["time_accuracy"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_each_sequence_names_known_cases_of_one_server():
    with open(BENCH / "data" / "published_runs.csv", newline="") as f:
        runs = {r["case_id"]: r for r in csv.DictReader(f)}
    with open(BENCH / "data" / "server_sequences.csv", newline="") as f:
        seqs = list(csv.DictReader(f))
    seen = set()
    for s in seqs:
        ids = s["case_ids"].split()
        assert len(ids) >= 2 and s["evidence"], s["sequence_id"]
        assert not seen & set(ids), "a case runs on one server"
        seen |= set(ids)
        assert all(i in runs for i in ids), s["sequence_id"]
        server = {(runs[i]["model"], runs[i]["gpu"], runs[i]["tp"], runs[i]["source_url"]) for i in ids}
        assert len(server) == 1, s["sequence_id"]  # one page, one model on one deployment


def test_warm_server_cache_hits_follow_the_seeded_draws():
    """DeepSeek-V3.1's page: the 1K/8K runs draw the same input lengths as the 1K/1K runs (both --random-input-len
    1000, lengths drawn first), so every 1K/8K prompt is cached whole (SGLang computes its last token); the 8K/1K
    C=16 run's first 10 prompts are the 8K/1K C=1 run's, and its prompt 10 is longest earlier as the 1K/1K C=100
    run's prompt 10: min of the two lengths. The first run's own warm-up caches only its prompt 0."""
    ta = _time_accuracy()
    cases = {c.id: c for c in ta.load_cases()[0]}
    first = cases["dsv31-mi300x-r1k1k-c1"]
    assert first.cached[0] == first.input_lens[0] - 1 and first.cached[1:] == [0] * 9
    for cid in ("dsv31-mi300x-r1k8k-c1", "dsv31-mi300x-r1k8k-c64"):
        c = cases[cid]
        assert c.cached == [n - 1 for n in c.input_lens]
    c16 = cases["dsv31-mi300x-r8k1k-c16"]
    assert c16.cached[:10] == [n - 1 for n in c16.input_lens[:10]]
    long_lens = np.random.RandomState(1).randint(1, 8001, size=80)
    short_lens = np.random.RandomState(1).randint(1, 1001, size=500)
    assert c16.input_lens == long_lens.tolist()
    assert c16.cached[10] == min(int(short_lens[10]), int(long_lens[10]) - 1)
    alone = cases["dsr1-h200-r1k1k-c4-ix0512"]  # InferenceX: no known sequence, only its warm-up's prompt 0
    assert alone.sequence == "" and alone.cached[1:] == [0] * (len(alone.cached) - 1)


def test_a_server_flag_quoted_once_applies_to_every_case_of_its_sequence():
    ta = _time_accuracy()
    rows = [{"case_id": "a", "notes": "server --attention-backend triton --tp 1"}, {"case_id": "b", "notes": "x"},
            {"case_id": "c", "notes": "--mem-fraction-static 0.8"}]
    assert ta.shared_server_flags(rows, {"s": ["a", "b"]}) == {"a": {"attention_backend": "triton"},
                                                               "b": {"attention_backend": "triton"}}
    conflict = rows + [{"case_id": "d", "notes": "--attention-backend flashinfer"}]
    with pytest.raises(ValueError, match="sequence s quotes attention_backend"):  # one server, one backend
        ta.shared_server_flags(conflict, {"s": ["a", "d"]})
    # the published GLM-4.7-Flash page: one triton server for all nine runs
    cases, _ = ta.load_cases()
    glm = [c for c in cases if c.id.startswith("glm47flash-b200-r")]
    assert len(glm) == 9 and all(c.args.attention_backend == "triton" and c.cost.triton_decode for c in glm)
