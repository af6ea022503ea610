"""SIGTERM and SIGHUP stop `run` and `sweep` as Ctrl-C does: hidden folders and locks removed, workers terminated,
one line saying what was kept, exit 128 + the signal. Real processes, real signals."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

POOLSIM = [sys.executable, "-m", "poolsim.cli"]


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory):
    """~20k short requests: a run of many seconds, stopped after its first second."""
    path = tmp_path_factory.mktemp("signals") / "long.jsonl"
    subprocess.run([*POOLSIM, "trace", "generate", str(path), "--sessions", "20000", "--rate", "200", "--turns",
                    "fixed:1", "--input-len", "fixed:200", "--output-len", "fixed:400"], check=True,
                   capture_output=True, timeout=300)
    return path


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def _wait_for(condition, timeout=120.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return False


def _contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _hidden(out: Path) -> list[Path]:
    return [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]


def _start(args, cwd):
    return subprocess.Popen([*POOLSIM, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc for the process tree")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_stops_run_leaving_no_hidden_folder_or_lock(tmp_path, long_trace, signum):
    out = tmp_path / "report"
    proc = _start(["run", str(long_trace), "--model", "llama-3.1-8b", "--gpu", "H100", "--quiet", "--out", str(out)],
                  tmp_path)
    # simulating: the hidden sibling exists (the step table streams into it) and holds the lock
    assert _wait_for(lambda: any(p.is_dir() for p in _hidden(out)) or proc.poll() is not None)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    assert err.strip().splitlines()[-1] == (f"poolsim: stopped by {signal.Signals(signum).name}; nothing was "
                                            f"written to {out}")
    assert "Traceback" not in err
    assert not out.exists() and _hidden(out) == []  # neither the hidden folder nor .report.poolsim-lock


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc for the process tree")
def test_sigterm_keeps_a_previous_run_whole(tmp_path, long_trace):
    out = tmp_path / "report"
    subprocess.run([*POOLSIM, "run", "--model", "llama-3.1-8b", "--gpu", "H100", "--quiet", "--out", str(out)],
                   cwd=tmp_path, check=True, capture_output=True, timeout=300)
    before = _contents(out)
    proc = _start(["run", str(long_trace), "--model", "llama-3.1-8b", "--gpu", "H100", "--quiet", "--out", str(out)],
                  tmp_path)
    assert _wait_for(lambda: any(p.is_dir() for p in _hidden(out)) or proc.poll() is not None)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1].endswith(f"; {out} left as it was (the previous run there is kept)")
    assert _contents(out) == before and _hidden(out) == []


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc for the process tree")
def test_sigterm_to_a_sweep_terminates_its_workers(tmp_path, long_trace):
    out = tmp_path / "sweep"
    proc = _start(["sweep", str(long_trace), "--model", "llama-3.1-8b", "--grid", "gpu=H100,H200", "--grid",
                   "page_size=1,16", "--workers", "2", "--out", str(out)], tmp_path)
    assert _wait_for(lambda: len(_children(proc.pid)) >= 2 or proc.poll() is not None)
    workers = _children(proc.pid)
    assert proc.poll() is None and len(workers) >= 2, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1].startswith("poolsim: stopped by SIGTERM")
    assert "Traceback" not in err
    assert _wait_for(lambda: not any(Path(f"/proc/{w}").exists() for w in workers), timeout=30), workers
    assert not out.exists() and _hidden(out) == []
