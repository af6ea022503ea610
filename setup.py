"""Build hook: the simulator's hot modules compiled with mypyc when the build can, pure Python when it cannot.

``pip install -e .`` (or a wheel build) compiles ``COMPILED_MODULES`` into C extensions next to their sources
(about a minute: mypy's type pass, then the C files through gcc), and records each compiled source's sha256 in
``pools/_compiled_sources.json``. Any failure (no C compiler, no mypyc, a mypyc error) leaves a pure-Python install
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
# backend keeps a module in an attribute, which mypyc drops). The manifest the build writes is the run time's
# list of what was compiled.
COMPILED_MODULES = [
    "pools.radix_cache", "pools.mamba_radix_cache", "pools.allocator", "pools.free_list", "pools.req_to_token_pool",
    "pools.allocation", "pools.kv_cache", "pools.mamba_pool", "pools.base_prefix_cache", "pools.no_cache",
    "pools.req_kv", "sim.scheduler", "sim.engine", "sim.prefill_adder", "sim.schedule_batch", "sim.schedule_policy",
    "sim.req", "sim.step_time",
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
        if not self.extensions:  # not compiling (POOLSIM_NO_COMPILE=1, no mypyc): no earlier build may linger
            self._remove_outputs()
            return
        try:
            super().run()
            self._write_manifest()
        except BaseException as e:  # compiler errors surface as SystemExit or DistutilsError
            if isinstance(e, KeyboardInterrupt):
                raise
            self._give_up(e)

    def _manifest_path(self) -> str:
        base = os.path.dirname(os.path.abspath(__file__)) if self.inplace else self.build_lib
        return os.path.join(base, "pools", MANIFEST)

    def _write_manifest(self) -> None:
        """What was compiled, by content: pools/_pure_python.py runs the sources when any of them has changed."""
        here = os.path.dirname(os.path.abspath(__file__))
        digests = {}
        for module in COMPILED_MODULES:
            rel = module.replace(".", "/") + ".py"
            with open(os.path.join(here, rel), "rb") as f:
                digests[rel] = hashlib.sha256(f.read()).hexdigest()
        with open(self._manifest_path(), "w") as f:
            json.dump(digests, f, indent=1, sort_keys=True)

    def _give_up(self, e: BaseException) -> None:
        sys.stderr.write(WARNING.format(f"{type(e).__name__}: {e}"))
        traceback.print_exc(file=sys.stderr)
        self._remove_outputs()
        self.extensions = []

    def _remove_outputs(self) -> None:
        """This build's own outputs, by name: the shared C library and every module's shim go together or not at
        all, and the manifest with them."""
        for name in [GROUP + "__mypyc", *COMPILED_MODULES]:
            for path in (self.get_ext_fullpath(name), self._inplace_path(name)):
                if os.path.exists(path):
                    os.remove(path)
        if os.path.exists(self._manifest_path()):
            os.remove(self._manifest_path())

    def _inplace_path(self, name: str) -> str:
        parts = name.split(".")
        filename = os.path.basename(self.get_ext_filename(name))
        return os.path.join(os.path.dirname(os.path.abspath(__file__)), *parts[:-1], filename)

    def get_outputs(self) -> list[str]:
        outputs = [*super().get_outputs(), self._manifest_path()] if self.extensions else []
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
