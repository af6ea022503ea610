"""reports/METRICS.md stays in sync with what the simulator writes: every column and summary key has an entry,
and every entry names something that exists."""

import json

import pytest

from poolsim.reports import definitions
from poolsim.reports.tables import flatten
from poolsim.sim.metrics import HOST_STEP_COLUMNS, REQUEST_COLUMNS, STEP_COLUMNS

REQUEST_DERIVED = ("ttft_s", "e2e_s", "itl_s")


def defined(namespace):
    return {n.split(".", 1)[1] for n in definitions.index() if n.startswith(namespace + ".")}


def summary_keys(run_dirs):
    keys = set()
    for d in run_dirs.values():
        keys |= set(flatten(json.loads((d / "summary.json").read_text())))
    return keys


def test_every_column_is_defined_and_nothing_else():
    assert defined("steps") == set(STEP_COLUMNS) | set(HOST_STEP_COLUMNS)
    assert defined("requests") == set(REQUEST_COLUMNS) | set(REQUEST_DERIVED)


def test_every_summary_key_is_defined_and_nothing_else(run_dirs):
    # the scenarios together produce every key: a retraction (first_retraction.*) and a hybrid (pools.mamba.*)
    keys = summary_keys(run_dirs)
    assert "first_retraction.time_s" in keys and "pools.mamba.mean_idle_slots" in keys
    keys.discard("first_retraction")  # null when nothing retracted; its fields are defined
    assert keys - defined("summary") == set(), "summary keys without a METRICS.md entry"
    assert defined("summary") - keys == set(), "METRICS.md entries the summary no longer has"


def test_every_entry_has_a_unit_and_a_definition():
    for section in definitions.load():
        for m in section.metrics:
            assert m.unit and len(m.text) > 10, m.names


def test_names_are_unique():
    names = [n for s in definitions.load() for m in s.metrics for n in m.names]
    assert len(names) == len(set(names))


def test_a_malformed_bullet_names_its_line(tmp_path):
    md = tmp_path / "METRICS.md"
    md.write_text("# m\n\n## steps.csv: x\n\n- `a` (s): fine.\n- b without backticks: broken\n")
    with pytest.raises(ValueError, match=r"METRICS.md:6: expected"):
        definitions.load(md)


def test_continuation_lines_and_several_names(tmp_path):
    md = tmp_path / "METRICS.md"
    md.write_text("## summary.json: x\n\n- `t.p50`, `t.p99` (s): first\n  second.\n- `n` (count): third.\n")
    (section,) = definitions.load(md)
    assert section.namespace == "summary"
    assert [m.names for m in section.metrics] == [("summary.t.p50", "summary.t.p99"), ("summary.n",)]
    assert section.metrics[0].text == "first second."
    assert section.metrics[0].anchor == "m-summary-t-p50"
