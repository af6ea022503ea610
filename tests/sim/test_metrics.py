"""The recorder's columnar chunks: the same frames as building them from all rows at once, and the streamed
step table byte-identical to writing the whole frame."""

import pandas as pd
import pytest

from poolsim.sim.metrics import STEP_COLUMNS, Recorder, Table

COLUMNS = ("i", "f", "maybe_int", "kind", "flag", "maybe_flag", "none_late")


def rows(n):
    """Columns whose dtype depends on which rows a chunk holds: ints with a missing value only in row 5 (float
    in the whole table), bools with a None in row 9 (object), all-None until row 11 then floats."""
    return [(i, i / 3, None if i == 5 else i * 10, "decode" if i % 2 else "extend", i % 3 == 0,
             None if i == 9 else i % 2 == 0, None if i < 11 else i * 0.5) for i in range(n)]


@pytest.mark.parametrize("chunk_rows", [1, 2, 4, 5, 7, 1000])
def test_chunked_frame_equals_the_frame_built_from_all_rows(chunk_rows):
    table = Table(COLUMNS, chunk_rows=chunk_rows)
    for row in rows(13):
        table.append(row)
    assert len(table) == 13
    expected = pd.DataFrame(rows(13), columns=list(COLUMNS))
    got = table.frame()
    pd.testing.assert_frame_equal(got, expected)
    assert [str(got[c].dtype) for c in ("i", "maybe_int", "flag", "maybe_flag", "none_late")] == [
        "int64", "float64", "bool", "object", "float64"]


def test_an_empty_table_has_its_columns():
    assert list(Table(COLUMNS).frame().columns) == list(COLUMNS)


@pytest.mark.parametrize("chunk_rows", [3, 5, 1000])
def test_streamed_csv_is_the_whole_frames_csv(tmp_path, chunk_rows):
    table = Table(COLUMNS, chunk_rows=chunk_rows, stream=tmp_path / "t.csv")
    for i, row in enumerate(rows(13)):
        table.append(row)
        if i == 5 and chunk_rows == 3:  # two chunks already on disk during the run
            assert len((tmp_path / "t.csv").read_text().splitlines()) == 1 + 6
    frame = table.frame()
    assert (tmp_path / "t.csv").read_text() == frame.to_csv(index=False)  # incl. rows written before row 5's None


def test_streamed_parquet_reads_back_as_the_frame(tmp_path):
    pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'poolsim[parquet]')")
    for chunk_rows in (4, 1000):
        table = Table(COLUMNS, chunk_rows=chunk_rows, stream=tmp_path / "t.parquet", table_format="parquet")
        for row in rows(13):
            table.append(row)
        frame = table.frame()
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "t.parquet"), frame)


def test_a_simulation_streams_its_step_table(tmp_path):
    from poolsim.app.run import simulate
    from poolsim.pools.hardware.gpu_catalog import get_gpu
    from poolsim.pools.model.config import ModelConfig
    from poolsim.pools.sizing.server_args import ServerArgs
    from poolsim.traces import DEFAULT_TRACE, load_trace

    args = (load_trace(DEFAULT_TRACE), ModelConfig.load("llama-3.1-8b"), get_gpu("H100"), ServerArgs())
    plain = simulate(*args)
    streamed = simulate(*args, stream_dir=tmp_path, chunk_rows=100)
    pd.testing.assert_frame_equal(streamed.steps, plain.steps)
    pd.testing.assert_frame_equal(streamed.requests, plain.requests)
    assert streamed.summary == plain.summary
    assert len(plain.steps) > 300  # several chunks
    assert (tmp_path / "steps.csv").read_text() == plain.steps.to_csv(index=False)
    assert list(plain.steps.columns) == list(STEP_COLUMNS)


def test_unknown_table_format():
    with pytest.raises(ValueError, match="table format 'xlsx': expected one of csv, parquet"):
        Recorder(table_format="xlsx")


def test_a_streamed_step_table_is_not_rewritten_and_a_run_keeps_only_the_summarys_columns(tmp_path, monkeypatch):
    """The step file is appended chunk by chunk and left as it is (its dtypes never change, text included); a run
    that keeps only the summary's step columns gives the same summary, number for number."""
    import json

    from poolsim.app.run import simulate
    from poolsim.pools.hardware.gpu_catalog import get_gpu
    from poolsim.pools.model.config import ModelConfig
    from poolsim.pools.sizing.server_args import ServerArgs
    from poolsim.reports.summary import SUMMARY_STEP_COLUMNS
    from poolsim.sim import metrics
    from poolsim.traces import DEFAULT_TRACE, load_trace

    args = (load_trace(DEFAULT_TRACE), ModelConfig.load("llama-3.1-8b"), get_gpu("H100"), ServerArgs())
    plain = simulate(*args)

    def no_rewrite(*a, **k):
        raise AssertionError("the streamed step table was rewritten whole")

    monkeypatch.setattr(metrics, "write_table", no_rewrite)
    lean = simulate(*args, stream_dir=tmp_path, chunk_rows=100, keep_steps=False)
    assert (tmp_path / "steps.csv").read_text() == plain.steps.to_csv(index=False)
    assert list(lean.steps.columns) == [c for c in STEP_COLUMNS if c in SUMMARY_STEP_COLUMNS]
    pd.testing.assert_frame_equal(lean.steps, plain.steps[list(lean.steps.columns)])
    assert json.dumps(lean.summary, default=float) == json.dumps(plain.summary, default=float)


def test_columns_built_by_numpy_keep_pandas_dtypes():
    """The packed chunk's columns have the dtypes pandas infers from the rows: ints and floats -> float64, numpy
    int64 scalars with ints -> int64, a bool among ints -> object, ints past int64 -> uint64, text -> str."""
    big = 2**63
    data = [(1, 1, True, big, "a"), (2.5, 2, 3, 1, "b")]
    cols = ("mixed", "np_int", "bool_int", "big", "text")
    rows_ = [(r[0], pd.Series([r[1]]).to_numpy()[0] if i == 0 else r[1], *r[2:]) for i, r in enumerate(data)]
    table = Table(cols)  # one chunk
    for row in rows_:
        table.append(row)
    got = table.frame()
    pd.testing.assert_frame_equal(got, pd.DataFrame(rows_, columns=list(cols)))
    assert [str(got[c].dtype) for c in cols] == ["float64", "int64", "object", "uint64", "str"]
    assert got["mixed"].tolist() == [1.0, 2.5] and got["big"].tolist() == [big, 1]
    assert got["bool_int"].tolist() == [True, 3] and got["text"].tolist() == ["a", "b"]


def test_the_engine_records_typed_step_rows(monkeypatch):
    """Every step row is a StepRow whose values have their fields' types (an int where a float is declared is
    fine, as Python's typing allows); the step table's columns are its fields."""
    import typing

    from poolsim.sim import metrics
    from poolsim.sim.scheduler import SchedulerConfig
    from tests.helpers import TraceReq, run_sim

    assert metrics.STEP_COLUMNS == metrics.StepRow._fields
    rows = []
    monkeypatch.setattr(metrics.Recorder, "on_step", lambda self, row: (rows.append(row), self.steps.append(row)))
    config = SchedulerConfig(page_size=4, max_total_num_tokens=64, max_running_requests=4, context_len=64,
                             chunked_prefill_size=8, enable_overlap=True)
    trace = [TraceReq(i, 0.01 * i, [1 + i % 2] * 12 + [50 + i], 5) for i in range(6)]
    steps, _, _ = run_sim(trace, config)
    assert len(rows) == len(steps) > 10 and all(type(r) is metrics.StepRow for r in rows)
    allowed = {int: (int,), float: (int, float), str: (str,)}
    for name, hint in typing.get_type_hints(metrics.StepRow).items():
        assert {type(getattr(r, name)) for r in rows} <= set(allowed[hint]), name
    assert list(steps.columns) == list(metrics.STEP_COLUMNS)
