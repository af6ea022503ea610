"""The report as a person opens it: headless Chromium loads the page from disk, every figure decodes, the verdict
is on the page, nothing logs an error, nothing is fetched from the network, and the page does not overflow
sideways. Screenshots are kept (under $POOLSIM_SCREENSHOTS if set) for a person to look at."""

import html
import json
import os
import shutil
from pathlib import Path

import pytest
from PIL import Image

from poolsim.reports.html import render_comparison, render_report
from tests.reports.browser import WIDTH
from tests.reports.scenarios import write_scenario


def keep(screenshot: Path) -> None:
    target = os.environ.get("POOLSIM_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, Path(target) / screenshot.name)


def assert_seen_as_intended(found: dict, verdicts: list[str], num_figures: int, screenshot: Path) -> None:
    assert found["console_errors"] == []
    assert len(found["images"]) == num_figures
    for img in found["images"]:
        assert img["complete"] and img["naturalWidth"] > 0 and img["naturalHeight"] > 0, img
        assert img["scheme"] == "data", img
    assert found["verdicts"] == verdicts
    for v in verdicts:
        assert v in found["text"]
    assert found["brokenAnchors"] == []
    assert found["scrollWidth"] <= found["innerWidth"]  # nothing cut off at the right edge
    assert all(url.startswith(("file:", "data:")) for url in found["requests"]), found["requests"]
    width, height = Image.open(screenshot).size
    assert width == WIDTH and height == found["page_height"] > 2000


@pytest.mark.parametrize("scenario, figures", [("retracts", 5), ("hybrid", 6)])
def test_report_in_chromium(chromium, tmp_path, scenario, figures):
    # the way `poolsim run --out DIR` writes it: the report rendered inside write_run's temporary folder
    run_dir = write_scenario(scenario, tmp_path / scenario, render=render_report)
    verdict = json.loads((run_dir / "summary.json").read_text())["verdict"]
    shot = tmp_path / f"report-{scenario}.png"
    found = chromium.check_page(run_dir / "report.html", shot)
    keep(shot)
    assert_seen_as_intended(found, [verdict], figures, shot)
    # both scenarios' servers fall behind their arrivals (reports/summary.py: cannot keep up)
    assert "DOES NOT FIT" in found["text"]
    assert f"Run folder {scenario}." in found["text"]  # the final name, not write_run's temporary one


def test_comparison_in_chromium(chromium, run_dirs, tmp_path):
    page = render_comparison([run_dirs["fits"], run_dirs["aborts"]], tmp_path)
    verdicts = [json.loads((run_dirs[n] / "summary.json").read_text())["verdict"] for n in ("fits", "aborts")]
    shot = tmp_path / "comparison.png"
    found = chromium.check_page(page, shot)
    keep(shot)
    assert_seen_as_intended(found, verdicts, 3, shot)


def test_the_browser_check_sees_a_broken_page(chromium, tmp_path):
    """The checks can fail: a missing image, a script error and a console error are all reported."""
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><html><body><p class="verdict-text">' + html.escape("Fits.") + "</p>"
                    + "x" * 20 + '<img src="missing.png" alt="gone"><script>console.error("boom");'
                    "undefined_function();</script></body></html>")
    found = chromium.check_page(page, tmp_path / "broken.png")
    assert [(i["alt"], i["naturalWidth"]) for i in found["images"]] == [("gone", 0)]
    errors = " | ".join(found["console_errors"])
    assert "console.error: boom" in errors and "undefined_function" in errors and "load failed" in errors
    assert found["verdicts"] == ["Fits."]


def test_bundled_trace_report_from_the_cli_in_chromium(chromium, tmp_path):
    """The README's main job, end to end: `poolsim run` on the bundled trace writes the report; Chromium
    shows every figure (the hybrid one included), the verdict, and no errors."""
    from typer.testing import CliRunner

    from poolsim.cli import app

    out = tmp_path / "poolsim-report"
    result = CliRunner().invoke(app, ["run", "--model", "kimi-linear-48b-a3b", "--gpu", "H200", "--out", str(out),
                                      "--quiet"])
    assert result.exit_code == 0, result.output
    verdict = json.loads((out / "summary.json").read_text())["verdict"]
    shot = tmp_path / "report-bundled.png"
    found = chromium.check_page(out / "report.html", shot)
    keep(shot)
    assert_seen_as_intended(found, [verdict], 6, shot)
    assert "kimi-linear-48b-a3b on H200" in found["text"]
