"""Build hook: one import package, ``poolsim``, from the repository's top-level folders; the simulator's hot modules
compiled with mypyc when the build can, pure Python when it cannot.

Layout: the repository root *is* the ``poolsim`` package (``package_dir={"poolsim": "."}``), so ``pools/``,
``sim/``, ``traces/``, ``reports/``, ``kernels/``, ``app/`` and ``cli.py`` install as ``poolsim.pools``, ...,
``poolsim.cli``, for a wheel, an sdist and an editable install alike, and the wheel's only top-level name is
``poolsim`` (a generic name such as ``kernels`` would overwrite Hugging Face's ``kernels`` package, which SGLang
needs). The package list is explicit: ``tests/``, ``bench/`` and ``scripts/`` are not part of it, and
``setup.py`` itself is left out of the ``poolsim`` modules.

mypyc: ``pip install -e .`` (or a wheel build) compiles ``COMPILED_MODULES`` into C extensions next to their
sources (about a minute: mypy's type pass, then the C files through gcc), and records each compiled source's sha256
and the files it wrote in ``pools/_compiled_sources.json``; a later build removes only files such a manifest lists or
that it wrote itself, never a file that merely has an output's name. mypy names a module after the folders above it
that hold an ``__init__.py``, so the sources are type-checked from a temporary copy laid out as ``poolsim/...``
(the copy is the build's own and removed after it). Any failure (no C compiler, no mypyc, a mypyc error) leaves a
pure-Python install with a warning (``pip install -v`` shows it); the install itself never fails.
``POOLSIM_NO_COMPILE=1`` at install time skips the compile. At run time the sources win over the extensions when
``POOLSIM_PURE_PYTHON=1`` or when a source differs from the one compiled (compiled.py). Both give
identical outputs (tests/sim/test_compiled.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
import traceback

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "poolsim"
ROOT_MODULES = ("__init__", "cli", "compiled")  # the package's own modules at the root (not setup.py)
SUBPACKAGES = ("pools", "sim", "traces", "reports", "kernels", "app", "telemetry")  # the folders that make up the package

# The modules a py-spy profile of the Mooncake run spends its time in (pools/backend/__init__.py stays Python: its
# torch backend keeps a module in an attribute, which mypyc drops). The manifest the build writes is the run time's
# list of what was compiled.
COMPILED_MODULES = [PACKAGE + "." + m for m in (
    "pools.mem_cache.radix_cache", "pools.mem_cache.mamba_radix_cache", "pools.mem_cache.allocator.base",
    "pools.mem_cache.allocator.token", "pools.mem_cache.allocator.paged", "pools.mem_cache.allocator.mamba",
    "pools.mem_cache.allocator.free_list", "pools.mem_cache.pool.req_to_token", "pools.mem_cache.allocation",
    "pools.mem_cache.pool.base", "pools.mem_cache.pool.mha", "pools.mem_cache.pool.mla",
    "pools.mem_cache.pool.hybrid", "pools.mem_cache.pool.dsa", "pools.mem_cache.pool.swa", "pools.mem_cache.pool.mamba", "pools.mem_cache.base_prefix_cache",
    "pools.mem_cache.no_cache", "pools.mem_cache.req_kv", "pools.backend.numpy_backend", "sim.scheduler",
    "sim.engine", "sim.prefill_adder", "sim.schedule_batch", "sim.schedule_policy", "sim.req", "sim.step_time",
)]
MANIFEST = "_compiled_sources.json"  # {source path: sha256} of what was compiled (compiled.py)
METADATA_COMMANDS = {"dist_info", "egg_info", "sdist"}  # top-level commands that build nothing
GROUP = PACKAGE + ".pools._compiled"  # the shared C library every shim loads: pools/_compiled__mypyc.*.so

WARNING = ("\n*** poolsim: the mypyc build of the simulator's hot modules failed ({}); installing pure Python "
           "(identical results, ~1.4x slower). ***\n")


def source_path(module: str) -> str:
    """``poolsim.pools.x.y`` -> ``pools/x/y.py``, relative to the repository root."""
    return module.removeprefix(PACKAGE + ".").replace(".", "/") + ".py"


class BuildPy(build_py):
    """The root is the ``poolsim`` package: its modules are ``ROOT_MODULES``, not this script."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        if package == PACKAGE:
            modules = [m for m in modules if m[1] in ROOT_MODULES]
        return modules


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
        self._base = self._package_root()
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

    def _package_root(self) -> str:
        """Where ``poolsim`` lands: the source tree for an in-place (editable) build, else the build folder."""
        return HERE if self.inplace else os.path.join(os.path.abspath(self.build_lib), PACKAGE)

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
        """What was compiled, by content (compiled.py runs the sources when any has changed), and the
        files written, so that a later build removes only those."""
        digests = {}
        for module in COMPILED_MODULES:
            rel = source_path(module)
            with open(os.path.join(HERE, rel), "rb") as f:
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
        outputs = [*super().get_outputs(), os.path.join(self._package_root(), "pools", MANIFEST)] if self.extensions else []
        return [p for p in outputs if os.path.exists(p)]


def _stage_sources(stage: str) -> None:
    """Copy the package's ``.py`` files into ``stage/poolsim/`` so mypy names every module ``poolsim.*``."""
    root = os.path.join(stage, PACKAGE)
    os.makedirs(root)
    for name in ROOT_MODULES:
        shutil.copy2(os.path.join(HERE, name + ".py"), root)
    for sub in SUBPACKAGES:
        for folder, dirs, files in os.walk(os.path.join(HERE, sub)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            target = os.path.join(root, os.path.relpath(folder, HERE))
            os.makedirs(target, exist_ok=True)
            for f in files:
                if f.endswith((".py", ".pyi")):
                    shutil.copy2(os.path.join(folder, f), target)


@functools.cache  # one mypy pass a process
def _mypycify() -> tuple:
    stage = tempfile.mkdtemp(prefix="poolsim-mypyc-")  # the build's own copy, removed below
    cwd = os.getcwd()
    try:
        from mypyc.build import mypycify

        _stage_sources(stage)
        os.chdir(stage)  # relative paths: compiled tracebacks name poolsim/pools/..., not the temporary folder
        paths = [os.path.join(PACKAGE, source_path(m)) for m in COMPILED_MODULES]
        return tuple(mypycify(["--config-file", os.path.join(HERE, "mypyc.ini"), *paths], opt_level="3",
                              group_name=GROUP, target_dir=os.path.join(HERE, "build")))
    except BaseException as e:  # mypyc reports type errors with SystemExit
        if isinstance(e, KeyboardInterrupt):
            raise
        sys.stderr.write(WARNING.format(f"{type(e).__name__}: {e}"))
        return ()
    finally:
        os.chdir(cwd)
        shutil.rmtree(stage, ignore_errors=True)


def mypyc_extensions() -> list[Extension]:
    return [] if os.environ.get("POOLSIM_NO_COMPILE") == "1" else list(_mypycify())


def packages() -> list[str]:
    found = find_packages(where=HERE, include=[p for s in SUBPACKAGES for p in (s, s + ".*")])
    return [PACKAGE, *(f"{PACKAGE}.{p}" for p in found)]


# A placeholder so setuptools schedules build_ext; OptionalBuildExt replaces it with the real extensions.
setup(
    package_dir={PACKAGE: "."},
    packages=packages(),
    ext_modules=[Extension(GROUP + "__mypyc", sources=[])],
    cmdclass={"build_ext": OptionalBuildExt, "build_py": BuildPy},
)
