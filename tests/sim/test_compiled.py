"""The compiled core (setup.py builds the hot modules with mypyc) and its pure-Python fallback give the same outputs.

tests/sim/test_reference_equivalence.py pins the outputs of eleven configurations to hashes recorded from the
pure-Python code; in a compiled install it therefore checks the compiled modules. The test here replays the same
cases with POOLSIM_PURE_PYTHON=1 in a fresh interpreter, so both ways are checked against the same hashes in one
suite run, and checks which code each way actually ran.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import poolsim.compiled as pure
import poolsim.sim.scheduler  # noqa: F401  (a compiled module, loaded here so compiled_modules() can see it)

ROOT = Path(__file__).parents[2]
MANIFEST = ROOT / "pools" / pure.MANIFEST


def _compiled_here() -> bool:
    return "poolsim.sim.scheduler" in pure.compiled_modules()


def test_a_compiled_build_runs_its_extensions_unless_a_source_changed():
    if not MANIFEST.exists():
        pytest.skip("no compiled build here (POOLSIM_NO_COMPILE=1, or setup.py fell back to pure Python)")
    stale = pure.stale_sources(str(MANIFEST), str(ROOT))
    expected = not stale and os.environ.get("POOLSIM_PURE_PYTHON") != "1"
    assert _compiled_here() == expected, (stale, pure.compiled_modules())
    assert pure.core_description().startswith("compiled with mypyc" if expected else "in pure Python")


def test_the_pure_python_fallback_gives_the_reference_outputs():
    if not _compiled_here():
        pytest.skip("this run is pure Python already: test_reference_equivalence.py checks it")
    script = (
        "import sys, pytest\n"
        "rc = pytest.main(['-p', 'no:cacheprovider', 'tests/sim/test_reference_equivalence.py'])\n"
        "import poolsim.compiled as p\n"
        "print('COMPILED', p.compiled_modules())\n"
        "sys.exit(rc)\n")
    env = {**os.environ, "POOLSIM_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "COMPILED []" in out.stdout  # the goldens above were met by the .py sources, not the extensions
    assert " passed" in out.stdout and "failed" not in out.stdout


def test_stale_sources_names_each_source_whose_content_changed_since_the_build(tmp_path):
    (tmp_path / "pools").mkdir()
    a, b = tmp_path / "pools" / "a.py", tmp_path / "pools" / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    manifest = tmp_path / "manifest.json"
    assert pure.stale_sources(str(manifest), str(tmp_path)) == []  # no manifest: nothing was compiled
    manifest.write_text(json.dumps({"sources": {"pools/a.py": pure.source_digest(str(a)),
                                                "pools/b.py": pure.source_digest(str(b))}, "outputs": []}))
    assert pure.stale_sources(str(manifest), str(tmp_path)) == []
    os.utime(a, (1, 1))  # a new mtime alone is not a change (a fresh checkout touches every file)
    assert pure.stale_sources(str(manifest), str(tmp_path)) == []
    b.write_text("y = 3\n")
    assert pure.stale_sources(str(manifest), str(tmp_path)) == ["pools/b.py"]
    a.unlink()
    assert pure.stale_sources(str(manifest), str(tmp_path)) == ["pools/a.py", "pools/b.py"]
    manifest.write_text("{not json")  # what was compiled cannot be read: nothing compiled may run
    assert pure.stale_sources(str(manifest), str(tmp_path)) == ["manifest.json"]


def test_a_stale_build_or_the_switch_puts_the_sources_first(monkeypatch, capsys):
    monkeypatch.setattr(pure, "_why_sources", pure._why_sources)  # restored afterwards
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, pure._SourcesFirst)])
    monkeypatch.delenv("POOLSIM_PURE_PYTHON", raising=False)
    monkeypatch.setattr(pure, "stale_sources", lambda manifest, root: [])
    pure.install_if_asked()
    assert not any(isinstance(f, pure._SourcesFirst) for f in sys.meta_path)
    monkeypatch.setattr(pure, "stale_sources", lambda manifest, root: ["pools/mem_cache/radix_cache.py", "sim/req.py"])
    pure.install_if_asked()
    assert isinstance(sys.meta_path[0], pure._SourcesFirst)
    assert "pools/mem_cache/radix_cache.py differs from its compiled build (and 1 more)" in capsys.readouterr().err
    assert pure._why_sources == "pools/mem_cache/radix_cache.py changed since the compiled build"  # what `poolsim version` says
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, pure._SourcesFirst)])
    monkeypatch.setattr(pure, "stale_sources", lambda manifest, root: [])
    monkeypatch.setenv("POOLSIM_PURE_PYTHON", "1")
    pure.install_if_asked()
    assert isinstance(sys.meta_path[0], pure._SourcesFirst) and pure._why_sources == "POOLSIM_PURE_PYTHON=1"
    spec = sys.meta_path[0].find_spec("poolsim.sim.req", [str(ROOT / "sim")])
    assert spec.origin == str(ROOT / "sim" / "req.py")
    assert sys.meta_path[0].find_spec("numpy.linalg", None) is None  # other packages: the standard finders


def test_setup_removes_only_the_files_a_build_of_its_own_recorded(tmp_path):
    """A build that does not compile (here POOLSIM_NO_COMPILE=1) clears an earlier build's outputs, named in that
    build's manifest, and the manifest; a file that merely has an output's name stays (nobody else's file goes)."""
    import importlib.machinery
    import shutil

    tree = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.so", MANIFEST.name, "*.egg-info")
    tree.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md", "mypyc.ini", "__init__.py", "cli.py", "compiled.py"):
        shutil.copy(ROOT / name, tree / name)
    for package in ("pools", "sim", "traces", "reports", "kernels", "app"):
        shutil.copytree(ROOT / package, tree / package, ignore=skip)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    ours, strangers = tree / "pools" / f"allocator{suffix}", tree / "pools" / f"radix_cache{suffix}"
    ours.write_text("an earlier build's shim")
    strangers.write_text("a file of an output's name that no manifest lists")
    manifest = tree / "pools" / MANIFEST.name
    manifest.write_text(json.dumps({"sources": {}, "outputs": [f"pools/allocator{suffix}"]}))
    out = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, capture_output=True,
                         text=True, env={**os.environ, "POOLSIM_NO_COMPILE": "1"}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not ours.exists() and not manifest.exists()
    assert strangers.read_text() == "a file of an output's name that no manifest lists"
