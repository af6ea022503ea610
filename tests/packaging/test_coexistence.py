"""poolsim installs beside SGLang's neighbours without touching them.

SGLang 0.5.23 needs Hugging Face's ``kernels`` package (transformers 5 runs ``from kernels import CUDAProperties``),
and ``traces`` is another distribution on PyPI. A wheel whose top-level names were ``kernels`` or ``traces``
overwrote their files on install and deleted them on uninstall. Here: the wheel's only top-level name is
``poolsim``; in a fresh environment holding stand-ins for both (built locally, no network), poolsim installs as a
wheel and then editable, runs ``plan``, ``run`` and the CPU ``calibrate --tiny`` path, uninstalls, and the
stand-ins are byte-for-byte what they were.

The fresh environment has no packages of its own: the dependencies (numpy, torch, ...) are reached through a
folder of links to this environment's, which holds neither poolsim nor its editable finder, and pip acts on it with
``--python`` (so nothing is downloaded or built but poolsim and the stand-ins).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STANDINS = {
    # name: (version, {module file: source})
    "kernels": ("0.14.1", {"kernels/__init__.py": (
        '"""Stand-in for Hugging Face kernels 0.14 (what transformers imports)."""\n'
        "class CUDAProperties:\n    pass\n\n\ndef get_kernel(name):\n    return name\n")}),
    "traces": ("0.1.0", {"traces/__init__.py": '"""Stand-in for the PyPI distribution named traces."""\nTRACES = 1\n'}),
}
PIP = [sys.executable, "-m", "pip"]
QUIET = ["-q", "--disable-pip-version-check", "--no-input"]

pytestmark = pytest.mark.slow


def _run(cmd, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def _build_standin(name: str, where: Path) -> Path:
    version, files = STANDINS[name]
    src = where / f"src-{name}"
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    (src / "pyproject.toml").write_text(
        f'[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\n[tool.setuptools]\npackages = ["{name}"]\n')
    _run([*PIP, "wheel", *QUIET, "--no-deps", "--no-build-isolation", "--no-index", str(src), "-w", str(where)])
    return next(where.glob(f"{name}-{version}-*.whl"))


NO_COMPILE = {**os.environ, "POOLSIM_NO_COMPILE": "1"}  # pure Python: the layout is what is tested here


def _checkout_copy(where: Path) -> Path:
    """The tracked files alone: a build writes beside the sources, and a stale build/ folder could leak in."""
    tracked = _run(["git", "ls-files", "-z"], cwd=ROOT).stdout.split("\0")
    for rel in filter(None, tracked):
        if (ROOT / rel).is_file():
            (where / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, where / rel)
    return where


def _poolsim_wheel(source: Path, where: Path) -> Path:
    _run([*PIP, "wheel", *QUIET, "--no-deps", "--no-build-isolation", "--no-index", str(source), "-w", str(where)],
         env=NO_COMPILE)
    return next(where.glob("poolsim-*.whl"))


def _deps_folder(where: Path) -> Path:
    """Links to every package of this environment except poolsim's own files (and pip, which acts from outside)."""
    site = Path(sysconfig.get_paths()["purelib"])
    deps = where / "deps"
    deps.mkdir()
    for entry in site.iterdir():
        low = entry.name.lower()
        if low.startswith(("poolsim", "__editable__", "_poolsim", "pip", "kernels", "traces")) or low.endswith(".pth"):
            continue
        (deps / entry.name).symlink_to(entry)
    return deps


def _fresh_env(where: Path, deps: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    python = where / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "_deps.pth").write_text(str(deps) + "\n")
    return python


def _digests(python: Path) -> dict[str, str]:
    """Every file of the two stand-in distributions, by content (RECORD lists them)."""
    probe = ("import hashlib, importlib.metadata as m, json\n"
             "out = {}\n"
             "for name in ('kernels', 'traces'):\n"
             "    d = m.distribution(name)\n"
             "    for f in d.files:\n"
             "        p = f.locate()\n"
             "        out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None\n"
             "print(json.dumps(out))\n")
    return json.loads(_run([str(python), "-c", probe]).stdout)


def _use_poolsim(env: Path, work: Path, label: str) -> None:
    poolsim = env / "bin" / "poolsim"
    cwd = work / f"cwd-{label}"  # outside the repository: nothing may come from the checkout by accident
    cwd.mkdir()
    run = lambda *a: _run([str(poolsim), *a], cwd=cwd)  # noqa: E731
    assert "max concurrency" in run("plan", "--model", "llama-3.1-8b", "--gpu", "H100").stdout
    run("run", "--model", "llama-3.1-8b", "--gpu", "H100", "--quiet", "--out", str(cwd / "report"))
    assert (cwd / "report" / "report.html").is_file()
    trace = cwd / "chat.jsonl"
    run("trace", "generate", str(trace), "--sessions", "3", "--rate", "6", "--turns", "uniform:1,2",
        "--input-len", "uniform:30,200", "--output-len", "uniform:4,8", "--seed", "1")
    run("calibrate", str(trace), "--model", "llama-3.1-8b", "--gpu", "H100", "--max-total-tokens", "16000",
        "--context-length", "4096", "--device", "cpu", "--tiny", "--max-steps", "4", "--triton-steps", "0",
        "--out", str(cwd / "cal"))
    assert json.loads((cwd / "cal" / "calibration.json").read_text())["coefficients"]
    # the neighbours still answer as themselves, with poolsim installed
    probe = "import kernels, traces; kernels.CUDAProperties; kernels.get_kernel; print(traces.TRACES)"
    assert _run([str(env / "bin" / "python"), "-c", probe], cwd=cwd).stdout.strip() == "1"
    assert _run([str(env / "bin" / "python"), "-c", "import poolsim.kernels as k; print(k.__name__)"],
                cwd=cwd).stdout.strip() == "poolsim.kernels"


def _installed_path(name: str) -> str:
    """A wheel member's path in site-packages: ``X.data/purelib/`` and ``X.data/platlib/`` install at the root (the
    wheel is tagged for the platform, since it may carry the compiled core)."""
    parts = name.split("/")
    if parts[0].endswith(".data") and len(parts) > 2 and parts[1] in ("purelib", "platlib"):
        return "/".join(parts[2:])
    return name


def test_the_wheel_has_one_top_level_name_and_leaves_hf_kernels_and_traces_intact(tmp_path):
    pytest.importorskip("torch")  # the calibrate path
    copy = _checkout_copy(tmp_path / "checkout")
    wheel = _poolsim_wheel(_checkout_copy(tmp_path / "wheel-source"), tmp_path / "wheels")
    with zipfile.ZipFile(wheel) as z:
        names = [_installed_path(n) for n in z.namelist()]
        top_level = next(n for n in z.namelist() if n.endswith(".dist-info/top_level.txt"))
        assert z.read(top_level).decode().split() == ["poolsim"]
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
    assert {n.split("/")[0] for n in names} == {"poolsim", dist_info}
    assert "poolsim/setup.py" not in names and not any(n.startswith("poolsim/tests/") for n in names)
    assert "poolsim/traces/data/default.jsonl" in names and "poolsim/reports/METRICS.md" in names

    standins = [_build_standin(n, tmp_path / "wheels") for n in STANDINS]
    env = tmp_path / "env"
    python = _fresh_env(env, _deps_folder(tmp_path))
    target = [*PIP, "--python", str(python)]
    _run([*target, "install", *QUIET, "--no-deps", "--no-index", *map(str, standins)])
    before = _digests(python)
    assert len(before) >= 4 and all(before.values())

    _run([*target, "install", *QUIET, "--no-deps", "--no-index", str(wheel)])
    assert _digests(python) == before
    _use_poolsim(env, tmp_path, "wheel")
    _run([*target, "uninstall", *QUIET, "-y", "poolsim"])
    assert _digests(python) == before

    # editable, from a copy of the checkout (an editable build writes beside the sources)
    _run([*target, "install", *QUIET, "--no-deps", "--no-index", "--no-build-isolation", "-e", str(copy)],
         env=NO_COMPILE)
    assert _digests(python) == before
    _use_poolsim(env, tmp_path, "editable")
    _run([*target, "uninstall", *QUIET, "-y", "poolsim"])
    after = _digests(python)
    assert after == before, {k: (before.get(k), after.get(k)) for k in set(before) | set(after)
                             if before.get(k) != after.get(k)}
    assert hashlib.sha256(STANDINS["kernels"][1]["kernels/__init__.py"].encode()).hexdigest() in before.values()
