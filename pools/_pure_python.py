"""The pure-Python switch: with ``POOLSIM_PURE_PYTHON=1`` the modules of ``pools`` and ``sim`` load from their
``.py`` sources even where a mypyc-built extension sits next to them (setup.py builds those; outputs are
identical either way, tests/sim/test_compiled.py checks it). Installed by both packages' ``__init__`` before they
import anything else."""

from __future__ import annotations

import importlib.util
import os
import sys

PACKAGES = ("pools", "sim")


class _SourcesFirst:
    """A meta-path finder ahead of the standard one: a submodule of ``PACKAGES`` with a ``.py`` file is loaded from
    it (the standard finder prefers an extension module of the same name)."""

    def find_spec(self, name, path=None, target=None):
        package, _, module = name.rpartition(".")
        if package not in PACKAGES:
            return None
        for folder in path or ():
            source = os.path.join(folder, module + ".py")
            if os.path.isfile(source):
                return importlib.util.spec_from_file_location(name, source)
        return None


def install_if_asked() -> None:
    if os.environ.get("POOLSIM_PURE_PYTHON") == "1" and not any(isinstance(f, _SourcesFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourcesFirst())


def compiled_modules() -> list[str]:
    """The loaded ``pools``/``sim`` modules that came from an extension (empty in a pure-Python run)."""
    return sorted(name for name, m in list(sys.modules.items())
                  if name.partition(".")[0] in PACKAGES and not (getattr(m, "__file__", None) or ".py").endswith(".py"))
