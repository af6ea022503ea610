"""A run's saved data: what ``poolsim report DIR`` re-renders from.

    DIR/steps.csv      one row per forward step (sim.metrics.STEP_COLUMNS)
    DIR/requests.csv   one row per request (sim.metrics.REQUEST_COLUMNS + ttft_s, e2e_s, itl_s)
    DIR/summary.json   sim.summary.summarize(...)
    DIR/run.json       what was simulated: model, GPU, server flags, trace, seed, poolsim version
Files are written to a temporary folder and moved into place, so a failed run leaves nothing half-written.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pandas as pd


def write_run(out_dir: str | Path, steps: pd.DataFrame, requests: pd.DataFrame, summary: dict, run: dict,
              extra=None) -> Path:
    """Write the run; ``extra(tmp_dir)`` may add files (the report) before the folder is published."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        steps.to_csv(tmp / "steps.csv", index=False)
        requests.to_csv(tmp / "requests.csv", index=False)
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
        (tmp / "run.json").write_text(json.dumps(run, indent=2, default=str) + "\n")
        if extra is not None:
            extra(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def read_run(out_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame, dict, dict]:
    out = Path(out_dir)
    missing = [f for f in ("steps.csv", "requests.csv", "summary.json", "run.json") if not (out / f).exists()]
    if missing:
        raise FileNotFoundError(f"{out}: not a poolsim run folder (missing {', '.join(missing)})")
    steps = pd.read_csv(out / "steps.csv")
    requests = pd.read_csv(out / "requests.csv", keep_default_na=True, dtype={"admission_steps": str,
                                                                              "cached_tokens": str})
    return steps, requests, json.loads((out / "summary.json").read_text()), json.loads((out / "run.json").read_text())
