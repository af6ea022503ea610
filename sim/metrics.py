"""The recorder: rows buffered briefly as tuples on the hot path, kept as columnar numpy chunks, optionally
streamed to disk chunk by chunk during the run, pandas frames once at the end (definitions in
reports/METRICS.md). The step table's columns are ``StepRow``'s fields and the request table's
``REQUEST_COLUMNS``: a new step column is one more field (at the end) and one more keyword where the engine builds
the row."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import pandas as pd


class StepRow(NamedTuple):
    """One forward step: a row of the step table, whose columns are these fields in this order
    (reports/METRICS.md defines each). A tuple, so ``Table`` stores it as any other row."""

    step: int
    replica: int
    time_s: float
    duration_s: float
    kind: str  # forward mode: extend | decode | mixed
    batch_size: int
    running: int
    waiting: int
    prefill_tokens: int
    cached_prefill_tokens: int
    decode_tokens: int
    available_size: int
    evictable_size: int
    protected_size: int
    free_req_rows: int
    mamba_free_slots: int
    mamba_evictable_states: int
    swa_available_size: int
    swa_evictable_size: int
    swa_protected_size: int
    retracted: int
    aborted: int
    evicted_tokens: int
    new_token_ratio: float
    partial_page_tokens: int
    row_tokens: int
    waiting_scheduled: int
    running_scheduled: int
    available_size_scheduled: int
    mamba_evicted_tokens: int


STEP_COLUMNS = StepRow._fields

# With --enable-hierarchical-cache the step table also has these, after STEP_COLUMNS (reports/METRICS.md):
# host slots the tree holds, host leaves (host-only nodes host eviction may take), and since the previous row:
# tokens loaded back host->device, written device->host, freed from host, and evicted from device with no host copy.
HOST_STEP_COLUMNS = ("host_used_size", "host_evictable_leaves", "host_loaded_tokens", "host_written_tokens",
                     "host_evicted_tokens", "dropped_tokens")

REQUEST_COLUMNS = (
    "rid", "replica", "arrival_s", "input_len", "output_len", "max_new_tokens", "admission_steps",
    "first_token_step", "finish_step", "first_token_s", "finish_s", "cached_tokens", "cached_tokens_first",
    "retraction_count", "aborted", "finished_reason", "tokens_not_cached", "abort_cause",
)

CHUNK_ROWS = 8192  # rows per columnar chunk: a few MB of tuples at most before they are packed
TABLE_FORMATS = ("csv", "parquet")


class Table:
    """An append-only table: tuples into a short buffer, every ``chunk_rows`` rows packed into one chunk of
    numpy columns (about 8 bytes a value instead of a tuple and boxed numbers). ``stream`` (a path) also appends
    each chunk to a CSV or Parquet file as it is packed. ``frame()`` gives exactly the DataFrame that
    ``pd.DataFrame(all_rows, columns=...)`` would: each column concatenated, and where chunks disagree on a
    column's dtype (ints in one, ints with a missing value in another) re-inferred from the values as pandas
    infers them from the rows."""

    def __init__(self, columns: tuple[str, ...], chunk_rows: int = CHUNK_ROWS, stream: Path | None = None,
                 table_format: str = "csv"):
        check_table_format(table_format, needs_writer=stream is not None)
        self.columns = list(columns)
        self.chunk_rows = chunk_rows
        self._buffer: list[tuple] = []
        self._chunks: list[list[np.ndarray | None]] = []  # None: a column already copied out
        self._len = 0
        self.stream = Path(stream) if stream is not None else None
        self.table_format = table_format
        self._writer = None  # pyarrow's ParquetWriter, opened with the first chunk
        self._stale = False  # the streamed file no longer matches the table: rewrite it at the end

    def __len__(self) -> int:
        return self._len

    def append(self, row: tuple) -> None:
        self._buffer.append(row)
        self._len += 1
        if len(self._buffer) >= self.chunk_rows:
            self._pack()

    def _pack(self) -> None:
        if not self._buffer:
            return
        columns = [_column(values) for values in zip(*self._buffer)]
        self._buffer = []
        self._chunks.append([c.to_numpy() if isinstance(c, pd.Series) else c for c in columns])
        if self.stream is not None:
            chunk = pd.DataFrame(dict(zip(self.columns, columns)), columns=self.columns)
            self._write(chunk, first=len(self._chunks) == 1)

    def _write(self, chunk: pd.DataFrame, first: bool) -> None:
        if self._stale:
            return
        if self.table_format == "csv":
            chunk.to_csv(self.stream, index=False, header=first, mode="w" if first else "a")
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(chunk, preserve_index=False)
        if self._writer is not None and not table.schema.equals(self._writer.schema):
            self._stale = True  # a column changed type: the file is rewritten whole at the end
            return
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.stream, table.schema)
        self._writer.write_table(table)

    def frame(self, columns=None) -> pd.DataFrame:
        """The whole table, or only ``columns`` of it; the chunks are released (call once). A streamed file is
        complete after this, all columns and rows of it."""
        self._pack()
        chunks, self._chunks = self._chunks, []
        keep = self.columns if columns is None else [c for c in self.columns if c in set(columns)]
        stale = self._stale or not chunks  # nothing streamed yet, or a chunk that could not be appended
        data, dropped = {}, {}
        for i, name in enumerate(self.columns):
            parts = [c[i] for c in chunks]
            for c in chunks:
                c[i] = None  # free each chunk's column once it is copied out: peak is one table, not two
            values = _concat(parts)
            # A column whose dtype changed after rows were written (an int column that later holds a missing
            # value reads "12.0" in the whole table, "12" in early chunks): the file is rewritten whole. Compared
            # on the numpy arrays: pandas shows a text column as "str" however it was streamed.
            stale = stale or (bool(parts) and values.dtype != parts[0].dtype)
            (data if name in keep else dropped)[name] = values
        if self.stream is not None:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            if stale:
                write_table(pd.DataFrame({**data, **dropped}, columns=self.columns), self.stream, self.table_format)
        return pd.DataFrame(data, columns=keep)


_INT_TYPES = frozenset({int, np.int64})
_NUMBER_TYPES = frozenset({int, float, np.int64, np.float64})


def _column(values: tuple):
    """One column of rows as ``pd.DataFrame(rows)`` infers it: plain ints -> int64, ints and floats ->
    float64, bools -> bool, text -> object, built by numpy without pandas' per-object inference; anything else
    (a missing value, a bool among ints) through pandas' own row inference, as a Series."""
    types = set(map(type, values))
    if types <= _INT_TYPES:
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:  # beyond int64: pandas decides (uint64 or object)
            pass
    elif types <= _NUMBER_TYPES:
        return np.array(values, dtype=np.float64)
    elif types == {bool}:
        return np.array(values, dtype=np.bool_)
    elif types == {str}:  # text: the object array pandas' str column gives back (a frame re-infers str from it)
        return np.array(values, dtype=object)
    return pd.DataFrame(list(zip(values)), columns=["v"])["v"]


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.array([], dtype=object)
    if len({p.dtype for p in parts}) == 1 or all(p.dtype.kind in "iuf" for p in parts):
        return np.concatenate(parts)  # one dtype, or ints and floats: numpy promotes as pandas would
    values = np.concatenate([p.astype(object) for p in parts])  # rare: mixed kinds, inferred as from rows
    return pd.DataFrame(list(zip(values)), columns=["v"])["v"].to_numpy()


def check_table_format(table_format: str, needs_writer: bool = True) -> None:
    """A table format poolsim can write here; ValueError (one line) otherwise, before any work."""
    if table_format not in TABLE_FORMATS:
        raise ValueError(f"table format {table_format!r}: expected one of {', '.join(TABLE_FORMATS)} "
                         "(--table-format)")
    if table_format == "parquet" and needs_writer:
        try:
            import pyarrow  # noqa: F401
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise ValueError("--table-format parquet: needs pyarrow, which is not installed "
                             "(pip install 'poolsim[parquet]')") from None


def write_table(frame: pd.DataFrame, path: Path, table_format: str = "csv") -> None:
    if table_format == "csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)


class Recorder:
    """Steps and finished requests. ``stream_dir``: the step table is also written there
    (``steps.csv`` / ``steps.parquet``) chunk by chunk during the run."""

    def __init__(self, stream_dir: str | Path | None = None, table_format: str = "csv",
                 chunk_rows: int = CHUNK_ROWS, extra_step_columns: tuple[str, ...] = ()):
        stream = Path(stream_dir) / f"steps.{table_format}" if stream_dir is not None else None
        self.steps = Table(STEP_COLUMNS + tuple(extra_step_columns), chunk_rows, stream, table_format)
        self.requests = Table(REQUEST_COLUMNS, chunk_rows)
        # called with each finished or aborted request (the engine's client releases it)
        self.on_done: Callable | None = None

    def on_step(self, row: tuple) -> None:  # a StepRow, then HOST_STEP_COLUMNS with HiCache
        self.steps.append(row)

    def on_finish(self, req) -> None:
        self.requests.append((
            req.rid, req.replica, req.arrival_s, int(req.trace_req.input_len), req.num_output, req.max_new_tokens,
            " ".join(map(str, req.admission_steps)), req.first_token_step, req.finish_step,
            req.first_token_time, req.finish_time, " ".join(map(str, req.cached_tokens)),
            req.cached_tokens[0] if req.cached_tokens else 0, req.retraction_count, req.aborted,
            req.finished_reason, req.tokens_not_cached, req.abort_cause or "",
        ))
        if self.on_done is not None:
            self.on_done(req)

    def step_frame(self, columns=None) -> pd.DataFrame:
        return self.steps.frame(columns)

    def request_frame(self) -> pd.DataFrame:
        df = self.requests.frame().sort_values("rid", kind="stable")
        df["ttft_s"] = df["first_token_s"] - df["arrival_s"]
        df["e2e_s"] = df["finish_s"] - df["arrival_s"]
        decoded = (df["output_len"] - 1).where(df["output_len"] > 1)
        df["itl_s"] = (df["finish_s"] - df["first_token_s"]) / decoded
        return df.reset_index(drop=True)


def percentiles(series: pd.Series, qs=(50, 90, 99)) -> dict:
    s = series.dropna()
    if s.empty:
        return {f"p{q}": None for q in qs}
    return {f"p{q}": float(np.percentile(s, q)) for q in qs}
