"""A run's saved data (what ``poolsim report DIR`` re-renders from), and the rules for every folder poolsim writes.

    DIR/steps.csv      one row per forward step (sim.metrics.STEP_COLUMNS); steps.parquet with --table-format parquet
    DIR/requests.csv   one row per request (sim.metrics.REQUEST_COLUMNS + ttft_s, e2e_s, itl_s); or requests.parquet
    DIR/summary.json   reports.summary.summarize(...)
    DIR/run.json       what was simulated: model, GPU, server flags, trace, seed, poolsim version
    DIR/.poolsim-run   the marker: poolsim wrote this folder, and these files (one relative path a line)

Never delete what poolsim did not write: an output folder must be new, empty, or hold the marker and no file
the marker does not list (a user's notes saved into a run folder stop it being replaced). It is filled
as a hidden temporary sibling ``.DIR-xxxxxxxx`` and swapped in by two renames, under a lock
(``.DIR.poolsim-lock``, fcntl) that a second run on the same folder cannot take. A killed run's temporary
siblings (they hold the marker; nobody holds the lock) are removed by the next run on that folder.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

MARKER = ".poolsim-run"
MARKER_HEADER = "written by poolsim, which may replace this folder; the files it wrote:\n"
RUN_FILES = ("steps.csv", "requests.csv", "summary.json", "run.json")  # the default (CSV) run folder
TABLES = ("steps", "requests")


class OutputError(ValueError):
    """An output path poolsim must not write; the message is one line naming the path."""


def check_out_dir(path: str | Path) -> str:
    """Validate an output folder before any work: "new", "empty" or "previous run"; OutputError otherwise."""
    out = Path(path)
    if out.resolve() in (Path.cwd().resolve(), *Path.cwd().resolve().parents):
        raise OutputError(f"{path}: is the current directory (or holds it); name a new folder for the output")
    if out.is_symlink():
        raise OutputError(f"{path}: is a symbolic link; name a new folder for the output")
    if out.exists() and not out.is_dir():
        raise OutputError(f"{path}: exists and is not a folder; name a new folder for the output")
    if out.is_dir():
        if (out / MARKER).is_file():
            foreign = sorted(set(_files(out)) - set(_listed(out)))
            if foreign:
                raise OutputError(f"{path}: holds files poolsim did not write ({', '.join(foreign[:3])}"
                                  f"{', ...' if len(foreign) > 3 else ''}); move them or name another folder")
            state = "previous run"
        elif any(out.iterdir()):
            raise OutputError(f"{path}: folder is not empty and was not written by poolsim (no {MARKER}); "
                              "poolsim replaces only its own output: name a new or empty folder")
        else:
            state = "empty"
    else:
        state = "new"
    _check_writable(out.parent, path)
    return state


def _files(folder: Path) -> list[str]:
    """Every file under ``folder`` (links included, not followed), as posix paths relative to it; not the marker."""
    out = []
    for root, dirs, names in os.walk(folder):
        rel = Path(root).relative_to(folder)
        out += [(rel / n).as_posix() for n in names + [d for d in dirs if Path(root, d).is_symlink()]]
    return [f for f in out if f != MARKER]


def _listed(folder: Path) -> list[str]:
    return [line for line in (folder / MARKER).read_text().splitlines()[1:] if line]


def record_files(folder: Path) -> None:
    """List every file now in ``folder`` (and in each marked folder inside it) in its marker: poolsim wrote them
    all, into a temporary folder nobody else knows of."""
    for root, _, names in os.walk(folder):
        if MARKER in names:
            Path(root, MARKER).write_text(MARKER_HEADER + "".join(f"{f}\n" for f in sorted(_files(Path(root)))))


@contextmanager
def recording(folder: str | Path):
    """Writing into a finished poolsim folder in place (``report`` re-rendering): list the files that appear."""
    folder = Path(folder)
    marked = (folder / MARKER).is_file()
    before = set(_files(folder)) if marked else set()
    yield
    if marked:
        new = sorted(set(_files(folder)) - before - set(_listed(folder)))
        with open(folder / MARKER, "a") as f:
            f.writelines(f"{n}\n" for n in new)


def _check_writable(parent: Path, path) -> None:
    """The nearest existing ancestor must be a folder we may create entries in."""
    p = parent if str(parent) else Path(".")
    while not p.exists():
        if p.is_symlink():
            raise OutputError(f"{path}: {p} is a broken link")
        p = p.parent
    if not p.is_dir():
        raise OutputError(f"{path}: {p} is not a folder")
    if not os.access(p, os.W_OK | os.X_OK):
        raise OutputError(f"{path}: cannot write in {p} (permission denied)")
    try:  # os.access says yes to root everywhere; a read-only mount or /proc only shows when we try
        os.rmdir(tempfile.mkdtemp(prefix=".poolsim-probe-", dir=p))
    except OSError as e:
        raise OutputError(f"{path}: cannot write in {p} ({(e.strerror or str(e)).lower()})") from None


class OutputLock:
    """``.NAME.poolsim-lock`` beside the folder, held with fcntl.flock (the kernel drops it if we are killed)."""

    def __init__(self, out: Path):
        self.out = out
        self.path = out.parent / f".{out.name}.poolsim-lock"
        self.fd: int | None = None

    def __enter__(self) -> OutputLock:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                    raise OutputError(f"{self.out}: another poolsim run is writing this folder; wait for it or "
                                      "name another") from None
                raise
            try:  # the holder before us may have unlinked the file we opened: lock the one on disk
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                return self
            os.close(fd)

    def __exit__(self, *exc) -> None:
        # While still held, so nobody locks a file that is about to vanish. poolsim never writes into its lock
        # file: one with content is somebody else's file of that name, and stays.
        if os.fstat(self.fd).st_size == 0:
            os.unlink(self.path)
        os.close(self.fd)
        self.fd = None


def _ours(name: str) -> re.Pattern:
    return re.compile(re.escape(f".{name}-") + r"[a-z0-9_]{8}")


def remove_stale(out: Path) -> list[Path]:
    """A killed run's hidden siblings of ``out`` (with the marker, or empty); call it holding the lock."""
    removed = []
    pattern = _ours(out.name)
    for p in out.parent.iterdir() if out.parent.is_dir() else ():
        if pattern.fullmatch(p.name) and p.is_dir() and not p.is_symlink():
            if (p / MARKER).is_file():
                shutil.rmtree(p)
                removed.append(p)
            elif not any(p.iterdir()):
                p.rmdir()
                removed.append(p)
    return removed


@contextmanager
def publish_dir(path: str | Path):
    """Yield a temporary folder to fill; on success it replaces ``path`` atomically. Nothing is left on failure.

    The caller should have called ``check_out_dir`` before its long work; it is checked again here, locked.
    """
    out = Path(path)
    check_out_dir(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with OutputLock(out):
        check_out_dir(out)  # again, now that nobody else can change it
        remove_stale(out)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
        try:
            (tmp / MARKER).write_text(MARKER_HEADER)  # first: marks the temporary folder ours
            yield tmp
            record_files(tmp)
            os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it 0700; a published folder gets the usual mode
            if out.exists():  # a previous run (marker) or an empty folder: both known to be ours to replace
                aside = out.parent / f".{out.name}-{secrets.token_hex(4)}"
                os.rename(out, aside)
                os.rename(tmp, out)
                shutil.rmtree(aside)
            else:
                os.rename(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_run_files(folder: Path, steps: pd.DataFrame | None, requests: pd.DataFrame, summary: dict, run: dict,
                    table_format: str = "csv") -> None:
    """``steps`` None: the step table is already in ``folder`` (streamed there by the run, app.run.simulate)."""
    from poolsim.sim.metrics import write_table

    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / MARKER).is_file():
        (folder / MARKER).write_text(MARKER_HEADER)
    if steps is not None:
        write_table(steps, folder / f"steps.{table_format}", table_format)
    write_table(requests, folder / f"requests.{table_format}", table_format)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
    (folder / "run.json").write_text(json.dumps(run, indent=2, default=str) + "\n")


def run_dirs(folder: Path | None, compare: bool) -> list[Path | None]:
    """Where `run --out` streams each run's step table: the folder itself, or its primary/ and compare/ with
    --compare-model (None: no --out)."""
    dirs = [folder] if not compare else [folder / "primary", folder / "compare"] if folder else [None, None]
    for d in dirs:
        if d is not None:
            d.mkdir(exist_ok=True)
    return dirs


def write_runs(folder: Path, dirs: list[Path], results: list, table_format: str = "csv") -> None:
    """The rest of `run --out` once the runs (app.run.RunResult) streamed their steps into ``dirs``: each run's
    tables, summary, run.json and report, and for two runs comparison.html in ``folder``."""
    from poolsim.reports.html import render_comparison, render_report

    for d, r in zip(dirs, results):
        write_run_files(d, None, r.requests, r.summary, r.run, table_format)  # steps: streamed
        r.steps = r.requests = None  # on disk now; the report reads them back: one copy at a time
    for d in dirs:
        render_report(d)
    if len(dirs) > 1:
        render_comparison(dirs, folder)


def write_run(out_dir: str | Path, steps: pd.DataFrame, requests: pd.DataFrame, summary: dict, run: dict,
              extra=None, table_format: str = "csv") -> Path:
    """Write the run; ``extra(tmp_dir)`` may add files (the report) before the folder is published."""
    with publish_dir(out_dir) as tmp:
        write_run_files(tmp, steps, requests, summary, run, table_format)
        if extra is not None:
            extra(tmp)
    return Path(out_dir)


def check_out_file(path: str | Path, force: bool = False, ours=None) -> None:
    """Validate an output file before any work. An existing file is replaced only if ``ours(path)`` says poolsim
    wrote it (e.g. a poolsim-format trace, a PNG tagged by poolsim), or with ``force``."""
    out = Path(path)
    if out.is_dir():
        raise OutputError(f"{path}: is a folder; name a file")
    if out.exists() and not force and not (ours is not None and out.is_file() and ours(out)):
        raise OutputError(f"{path}: exists and was not written by poolsim; add --force to overwrite it")
    _check_writable(out.parent, path)


def write_file(path: str | Path, write, force: bool = False, ours=None) -> Path:
    """``write(tmp_path)`` to a hidden sibling, then rename it over ``path`` (checked as ``check_out_file``)."""
    out = Path(path)
    check_out_file(out, force, ours)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{out.name}-", suffix=".tmp", dir=out.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        check_out_file(out, force, ours)  # again: a file may have appeared while we worked
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


PNG_SOFTWARE = "poolsim"  # the PNG "Software" text chunk poolsim writes into its figures


def png_by_poolsim(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(4096)
    return head.startswith(b"\x89PNG") and b"Software\x00" + PNG_SOFTWARE.encode() in head


def table_path(folder: str | Path, name: str) -> Path:
    """``folder/name.csv`` or ``folder/name.parquet``: the one the marker lists, else the one that exists (CSV
    first); the CSV path when neither does."""
    folder = Path(folder)
    paths = [folder / f"{name}.{fmt}" for fmt in ("csv", "parquet")]
    listed = set(_listed(folder)) if (folder / MARKER).is_file() else set()
    return next((p for p in paths if p.name in listed and p.exists()), None) or \
        next((p for p in paths if p.exists()), paths[0])


def run_files(folder: str | Path) -> list[Path]:
    """The four files of the run in ``folder`` (each table in the format it was written in)."""
    return [table_path(folder, t) for t in TABLES] + [Path(folder) / f for f in ("summary.json", "run.json")]


def read_table(path: Path, **csv_options) -> pd.DataFrame:
    if path.suffix == ".parquet":
        try:
            return pd.read_parquet(path)
        except ImportError:
            raise ValueError(f"{path}: reading Parquet needs pyarrow (pip install 'poolsim[parquet]')") from None
    return pd.read_csv(path, **csv_options)


def read_run(out_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame, dict, dict]:
    out = Path(out_dir)
    files = run_files(out)
    missing = [f.name for f in files if not f.exists()]
    if missing:
        raise FileNotFoundError(f"{out}: not a poolsim run folder (missing {', '.join(missing)})")
    steps = read_table(files[0])
    requests = read_table(files[1], keep_default_na=True, dtype={"admission_steps": str, "cached_tokens": str})
    return steps, requests, json.loads(files[2].read_text()), json.loads(files[3].read_text())


def report_target(run_dir: str, compare: list[str], out: str | None) -> Path | None:
    """Where `report --out` publishes a new folder, or None to write in place: into the run folder itself, or a
    poolsim folder that holds the runs. A folder holding another run is never replaced by a page."""
    if out is None:
        return None
    target, inputs = Path(out).resolve(), [Path(d).resolve() for d in (run_dir, *compare)]
    if target in inputs or ((target / MARKER).is_file() and any(target in d.parents for d in inputs)):
        return None
    if any(f.exists() for f in run_files(target)):
        raise ValueError(f"{out}: holds another run; name a new folder for the page")
    check_out_dir(out)
    return Path(out)
