"""SIGTERM and SIGHUP stop a command the way Ctrl-C does: the same cleanup, one line saying what was kept.

A signal handler raises ``Interrupted`` (a ``KeyboardInterrupt``, so every cleanup path written for Ctrl-C runs:
``publish_dir`` removes its hidden folder, the output lock is released, a sweep's pool terminates its workers).
The command's boundary (``stopping``) turns it into one line on stderr and exit code 128 + the signal number, as a
shell reports a process killed by that signal.
"""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    # the signal number is the only argument: code that re-raises ``type(e)(*e.args)`` (SimPy does, for an
    # exception out of a process) rebuilds the same exception
    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(int(signum))
        self.signum = int(signum)

    def __str__(self) -> str:
        return signal.Signals(self.signum).name


def _raise(signum, frame) -> None:
    raise Interrupted(signum)


@contextmanager
def stopping(out: str | Path | None = None, what: str = ""):
    """Run the block with SIGTERM/SIGHUP raising ``Interrupted``; on any interruption print one line (what was
    kept: ``out``'s previous contents, or nothing) and exit with 128 + the signal number."""
    existed = out is not None and Path(out).exists()
    previous = {s: signal.signal(s, _raise) for s in STOP_SIGNALS}
    try:
        yield
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        kept = ("" if out is None else
                f"; {out} left as it was (the previous run there is kept)" if existed else
                f"; nothing was written to {out}")
        sys.stderr.write(f"poolsim: stopped by {signal.Signals(signum).name}{what}{kept}\n")
        sys.stderr.flush()
        raise SystemExit(128 + signum) from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def worker_init(parent_pid: int) -> None:
    """In a worker process: the default action for SIGTERM/SIGHUP (the parent's handlers were inherited by the
    fork; its pool terminates workers with SIGTERM), Ctrl-C left to the parent, and (Linux ``PR_SET_PDEATHSIG``)
    an end when the parent ends, so a parent killed outright (SIGKILL, where no cleanup runs) leaves no worker
    computing on."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform == "linux":
        try:
            import ctypes

            pr_set_pdeathsig = 1  # linux/prctl.h
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent ended before the call above: nothing would signal us
        os._exit(1)
