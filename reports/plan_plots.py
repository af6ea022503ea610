"""Figures for ``poolsim plan --compare``: memory per request and concurrency against context length."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def plot_plan_compare(data, crossover_context_len: int | None = None, title: str | None = None) -> Figure:
    """Two panels per model: bytes per request (GiB, one rank) and max concurrent requests vs context length.

    ``data``: a DataFrame or records with columns model, context_len, bytes_per_request, max_concurrency
    (``pools.sizing.plan.compare_records``). ``crossover_context_len`` draws where the hybrid's fixed state
    stops costing more than the KV it replaces.
    """
    df = data if isinstance(data, pd.DataFrame) else pd.DataFrame(list(data))
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_bytes, ax_conc = fig.subplots(1, 2)
    for model, rows in df.groupby("model", sort=False):
        rows = rows.sort_values("context_len")
        ax_bytes.plot(rows["context_len"], rows["bytes_per_request"] / 2**30, marker="o", ms=3, label=model)
        fits = rows[rows["max_concurrency"] > 0]
        ax_conc.plot(fits["context_len"], fits["max_concurrency"], marker="o", ms=3, label=model)
    for ax in (ax_bytes, ax_conc):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length per request (tokens)")
        ax.grid(True, which="both", alpha=0.3)
        if crossover_context_len:
            ax.axvline(crossover_context_len, color="grey", ls="--", lw=1)
    ax_bytes.set_ylabel("KV + state per request (GiB, one rank)")
    ax_conc.set_ylabel("max concurrent requests")
    ax_bytes.legend(fontsize=8)
    if crossover_context_len:
        ax_bytes.annotate(f"state = replaced KV at {crossover_context_len:,} tokens", (crossover_context_len, 1),
                          xycoords=("data", "axes fraction"), xytext=(4, -12), textcoords="offset points",
                          fontsize=8, color="grey")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
