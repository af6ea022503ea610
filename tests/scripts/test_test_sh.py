"""scripts/test.sh installs Chromium quietly: one line saying what and why, apt's output kept in a log."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test.sh"


@pytest.mark.skipif(os.geteuid() != 0, reason="the install path runs apt directly only as root (as in CI)")
def test_chromium_install_prints_one_line(tmp_path):
    fake = tmp_path / "apt-get"  # a stand-in apt-get as noisy as the real one
    fake.write_text("#!/bin/sh\nfor i in $(seq 130); do echo \"Setting up libfoo$i ...\"; done\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    function = subprocess.run(["sed", "-n", "/^install_chromium()/,/^}/p", str(SCRIPT)], capture_output=True,
                              text=True, check=True).stdout
    log = tmp_path / "apt.log"
    res = subprocess.run(["bash", "-c", f'{function}\nlog="{log}"\ninstall_chromium'], capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert res.returncode == 0 and res.stderr == ""
    assert res.stdout == ("installing Chromium (apt: chromium, chromium-driver and ~130 dependencies) for the report's "
                          f"browser test; log in {log}\n")
    assert log.read_text().count("Setting up") == 260  # update and install, both logged
