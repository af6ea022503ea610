"""The live progress bars fit an 80-column terminal whole (nothing cut to '…'), and count what they count."""

import io

from rich.console import Console

from poolsim import cli


def _render(bar) -> str:
    console = Console(width=80, file=io.StringIO(), color_system=None)
    console.print(bar.get_renderable())
    return console.file.getvalue()


def test_run_bar_fits_80_columns():
    bar = cli._bar("kimi-linear-48b-a3b tp1", "requests", console=Console(width=80, file=io.StringIO()))
    bar.add_task("run", total=12031, completed=6000, t=4742.1)
    text = _render(bar)
    assert "…" not in text
    assert "6000/12031" in text and "sim 4,742 s" in text and "ETA" in text


def test_sweep_bar_counts_configurations():
    bar = cli._bar("sweep", "configurations", sim_time=False, console=Console(width=80, file=io.StringIO()))
    bar.add_task("run", total=6, completed=2, t=0.0)
    text = _render(bar)
    assert "2/6 configurations" in text and "requests" not in text and "sim" not in text
