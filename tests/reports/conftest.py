import warnings

import pytest

from tests.reports.scenarios import SCENARIOS, write_scenario

BROWSER_NOT_RUN: list[str] = []  # why the browser check could not run, printed loudly at the end


@pytest.fixture(scope="session")
def run_dirs(tmp_path_factory):
    """Every scenario simulated once and written as a run folder (no report yet): name -> folder."""
    root = tmp_path_factory.mktemp("runs")
    return {name: write_scenario(name, root / name) for name in SCENARIOS}


@pytest.fixture(scope="session")
def chromium():
    from tests.reports.browser import Chromium, find_chromium

    binary = find_chromium()
    if binary is None:
        why = ("Chromium is not installed (no chromium, chromium-browser or google-chrome on PATH): the report was "
               "NOT checked in a browser. Install it: apt-get install -y chromium chromium-driver")
        BROWSER_NOT_RUN.append(why)
        warnings.warn(why)
        pytest.skip(why)
    browser = Chromium(binary)
    yield browser
    browser.close()


def pytest_terminal_summary(terminalreporter):
    for why in dict.fromkeys(BROWSER_NOT_RUN):
        terminalreporter.write_sep("!", "BROWSER CHECK SKIPPED", red=True, bold=True)
        terminalreporter.write_line(why, red=True, bold=True)
