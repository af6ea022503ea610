"""Build hook: the simulator's hot modules compiled with mypyc when the build can, pure Python when it cannot.

``pip install -e .`` (or a wheel build) compiles ``COMPILED_MODULES`` into C extensions next to their sources
(about a minute: mypy's type pass, then the C files through gcc), and records each compiled source's sha256 and
the files it wrote in ``pools/_compiled_sources.json``; a later build removes only files such a manifest lists or that
it wrote itself, never a file that merely has an output's name. Any failure (no C compiler, no mypyc, a mypyc error) leaves a pure-Python install
with a warning (``pip install -v`` shows it); the install itself never fails. ``POOLSIM_NO_COMPILE=1`` at install
time skips the compile. At run time the sources win over the extensions when ``POOLSIM_PURE_PYTHON=1`` or when a
source differs from the one compiled (pools/_pure_python.py). Both give identical outputs
(tests/sim/test_compiled.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import traceback

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# The modules a py-spy profile of the Mooncake run spends its time in (pools/backend.py stays Python: its torch
# backend keeps a module in an attribute, which mypyc drops; the numpy backend is pools/numpy_backend.py). The
# manifest the build writes is the run time's list of what was compiled.
COMPILED_MODULES = [
    "pools.radix_cache", "pools.mamba_radix_cache", "pools.allocator", "pools.free_list", "pools.req_to_token_pool",
    "pools.allocation", "pools.kv_cache", "pools.mamba_pool", "pools.base_prefix_cache", "pools.no_cache",
    "pools.req_kv", "pools.numpy_backend", "sim.scheduler", "sim.engine", "sim.prefill_adder", "sim.schedule_batch",
    "sim.schedule_policy", "sim.req", "sim.step_time",
]
MANIFEST = "_compiled_sources.json"  # {source path: sha256} of what was compiled (pools/_pure_python.py)
METADATA_COMMANDS = {"dist_info", "egg_info", "sdist"}  # top-level commands that build nothing
GROUP = "pools._compiled"  # the shared C library every shim loads: pools/_compiled__mypyc.*.so

WARNING = ("\n*** poolsim: the mypyc build of the simulator's hot modules failed ({}); installing pure Python "
           "(identical results, ~1.4x slower). ***\n")


class OptionalBuildExt(build_ext):
    """build_ext that never fails the install: on any error no extension is kept, so nothing half-built loads."""

    def finalize_options(self) -> None:
        # egg_info (metadata, SOURCES.txt) finalizes build_ext too: mypy's pass runs only when something is built
        # (once a process: egg_info and build_ext share the result).
        if not set(self.distribution.commands) <= METADATA_COMMANDS:
            self.distribution.ext_modules = self.extensions = mypyc_extensions()
        super().finalize_options()
        if getattr(self, "editable_mode", False):
            self.inplace = True  # an editable install imports from the source tree: the .so files go there

    def run(self) -> None:
        # Fixed before building: setuptools clears ``inplace`` while it builds and, on an error, leaves it cleared.
        self._base = self._base_dir()
        candidates = {os.path.abspath(self.get_ext_fullpath(n)) for n in [GROUP + "__mypyc", *COMPILED_MODULES]}
        previous = self._previous_outputs()
        if not self.extensions:  # not compiling (POOLSIM_NO_COMPILE=1, no mypyc): no earlier build may linger
            self._remove(previous, manifest=True)
            return
        existed = {p for p in candidates if os.path.exists(p)}
        try:
            super().run()
            written = {p for p in candidates if os.path.exists(p)}
            self._write_manifest(written)
            self._remove(previous - written, manifest=False)  # a module no longer compiled must not shadow its .py
        except BaseException as e:  # compiler errors surface as SystemExit or DistutilsError
            if isinstance(e, KeyboardInterrupt):
                raise
            sys.stderr.write(WARNING.format(f"{type(e).__name__}: {e}"))
            traceback.print_exc(file=sys.stderr)
            # the shared library and every module's shim go together or not at all: what this build wrote and
            # what an earlier one recorded, never a file of that name that was there before and is in no manifest
            self._remove(previous | (candidates - existed), manifest=True)
            self.extensions = []

    def _base_dir(self) -> str:
        """Where the extensions go: the source tree for an in-place (editable) build, else the build folder."""
        return os.path.dirname(os.path.abspath(__file__)) if self.inplace else os.path.abspath(self.build_lib)

    def _manifest_path(self) -> str:
        return os.path.join(self._base, "pools", MANIFEST)

    def _previous_outputs(self) -> set[str]:
        """The files an earlier build recorded as its own in the manifest (none without a manifest of ours)."""
        try:
            with open(self._manifest_path()) as f:
                return {os.path.join(self._base, rel) for rel in json.load(f)["outputs"]}
        except (OSError, ValueError, KeyError, TypeError):
            return set()

    def _write_manifest(self, written: set[str]) -> None:
        """What was compiled, by content (pools/_pure_python.py runs the sources when any has changed), and the
        files written, so that a later build removes only those."""
        here = os.path.dirname(os.path.abspath(__file__))
        digests = {}
        for module in COMPILED_MODULES:
            rel = module.replace(".", "/") + ".py"
            with open(os.path.join(here, rel), "rb") as f:
                digests[rel] = hashlib.sha256(f.read()).hexdigest()
        outputs = sorted(os.path.relpath(p, self._base) for p in written)
        with open(self._manifest_path(), "w") as f:
            json.dump({"sources": digests, "outputs": outputs}, f, indent=1, sort_keys=True)

    def _remove(self, paths: set[str], manifest: bool) -> None:
        for path in paths:
            if os.path.exists(path):
                os.remove(path)
        if manifest and self._previous_outputs():  # a manifest in poolsim's own format, not a stranger's file
            os.remove(self._manifest_path())

    def get_outputs(self) -> list[str]:
        outputs = [*super().get_outputs(), os.path.join(self._base_dir(), "pools", MANIFEST)] if self.extensions else []
        return [p for p in outputs if os.path.exists(p)]


@functools.cache  # one mypy pass a process
def _mypycify() -> tuple:
    try:
        from mypyc.build import mypycify

        paths = [m.replace(".", "/") + ".py" for m in COMPILED_MODULES]
        return tuple(mypycify(["--config-file", "mypyc.ini", *paths], opt_level="3", group_name=GROUP))
    except BaseException as e:  # mypyc reports type errors with SystemExit
        if isinstance(e, KeyboardInterrupt):
            raise
        sys.stderr.write(WARNING.format(f"{type(e).__name__}: {e}"))
        return ()


def mypyc_extensions() -> list[Extension]:
    return [] if os.environ.get("POOLSIM_NO_COMPILE") == "1" else list(_mypycify())


# A placeholder so setuptools schedules build_ext; OptionalBuildExt replaces it with the real extensions.
setup(ext_modules=[Extension(GROUP + "__mypyc", sources=[])], cmdclass={"build_ext": OptionalBuildExt})
