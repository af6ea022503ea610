"""Which code runs: the mypyc-built extensions of ``poolsim.pools``/``poolsim.sim`` (setup.py builds them next to
their sources) or the ``.py`` sources. Outputs are identical either way (tests/sim/test_compiled.py); the extensions are ~1.4x
faster. Installed by ``poolsim/__init__.py``, before any module of the package loads.

The sources win for every module when ``POOLSIM_PURE_PYTHON=1``, or when any compiled module's source differs from
the one compiled (edited or checked out after the build; setup.py records each source's sha256): the extensions
call each other natively, so one stale module cannot be swapped alone, and running code other than the source on
disk would be a silent lie."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys

PACKAGES = ("poolsim.pools", "poolsim.sim")  # and their subpackages: where setup.py compiles modules
_ROOT = os.path.dirname(os.path.abspath(__file__))  # the poolsim package: the manifest's paths are relative to it
_POOLS = os.path.join(_ROOT, "pools")  # where setup.py writes the manifest beside the shared library


class _SourcesFirst:
    """A meta-path finder ahead of the standard one: a submodule of ``PACKAGES`` with a ``.py`` file is loaded from
    it (the standard finder prefers an extension module of the same name)."""

    def find_spec(self, name, path=None, target=None):
        package, _, module = name.rpartition(".")
        if not _in_packages(package):
            return None
        for folder in path or ():
            source = os.path.join(folder, module + ".py")
            if os.path.isfile(source):
                return importlib.util.spec_from_file_location(name, source)
        return None


def _in_packages(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in PACKAGES)


MANIFEST = "_compiled_sources.json"  # setup.py: {"sources": {path: sha256}, "outputs": [the files it wrote]}


def source_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def stale_sources(manifest: str, root: str) -> list[str]:
    """The compiled modules' sources (paths relative to ``root``) whose content differs from what was compiled, as
    ``manifest`` records it; none when there is no manifest (no compiled build)."""
    try:
        with open(manifest) as f:
            sources = json.load(f)["sources"]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError):  # unreadable: what was compiled cannot be checked
        return [os.path.relpath(manifest, root)]
    stale = []
    for rel, digest in sorted(sources.items()):
        path = os.path.join(root, rel)
        if not os.path.isfile(path) or source_digest(path) != digest:
            stale.append(rel)
    return stale


_why_sources = "no compiled build (pip install -e . compiles one where it can)"


def install_if_asked() -> None:
    if any(isinstance(f, _SourcesFirst) for f in sys.meta_path):
        return
    global _why_sources
    if os.environ.get("POOLSIM_PURE_PYTHON") == "1":
        _why_sources = "POOLSIM_PURE_PYTHON=1"
        sys.meta_path.insert(0, _SourcesFirst())
        return
    stale = stale_sources(os.path.join(_POOLS, MANIFEST), _ROOT)
    if stale:
        _why_sources = f"{stale[0]} changed since the compiled build"
        sys.stderr.write(f"poolsim: {stale[0]} differs from its compiled build"
                         f"{f' (and {len(stale) - 1} more)' if len(stale) > 1 else ''}; running the pure-Python "
                         "sources (same results, slower). Rebuild with `pip install -e .`.\n")
        sys.meta_path.insert(0, _SourcesFirst())


def compiled_modules() -> list[str]:
    """The loaded ``poolsim.pools``/``poolsim.sim`` modules that came from an extension (empty in a pure-Python
    run)."""
    return sorted(name for name, m in list(sys.modules.items())
                  if _in_packages(name) and not (getattr(m, "__file__", None) or ".py").endswith(".py"))


def core_description() -> str:
    """What ``poolsim version`` says of the code that runs."""
    return "compiled with mypyc" if compiled_modules() else f"in pure Python ({_why_sources})"
