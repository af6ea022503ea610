"""Build hook: the simulator's hot modules compiled with mypyc when the build can, pure Python when it cannot.

``pip install -e .`` (or a wheel build) compiles ``COMPILED_MODULES`` into C extensions next to their sources.
Any failure (no C compiler, no mypyc, a mypyc error) leaves a pure-Python install with a warning; the install
itself never fails. ``POOLSIM_NO_COMPILE=1`` at install time skips the compile; ``POOLSIM_PURE_PYTHON=1`` at run
time imports the ``.py`` sources even when the extensions exist (``pools/_pure_python.py``). Both give identical
outputs (tests/sim/test_compiled.py).
"""

from __future__ import annotations

import os
import sys
import traceback

from setuptools import setup
from setuptools.command.build_ext import build_ext

# The modules a py-spy profile of the Mooncake run spends its time in (pools/backend.py stays Python: its torch
# backend keeps a module in an attribute, which mypyc drops).
COMPILED_MODULES = [
    "pools.radix_cache", "pools.mamba_radix_cache", "pools.allocator", "pools.free_list", "pools.req_to_token_pool",
    "pools.allocation", "pools.kv_cache", "pools.mamba_pool", "pools.base_prefix_cache", "pools.no_cache",
    "pools.req_kv", "sim.scheduler", "sim.engine", "sim.prefill_adder", "sim.schedule_batch", "sim.schedule_policy",
    "sim.req", "sim.step_time",
]

WARNING = ("\n*** poolsim: the mypyc build of the simulator's hot modules failed ({}); installing pure Python "
           "(identical results, ~1.4x slower). ***\n")


class OptionalBuildExt(build_ext):
    """build_ext that never fails the install: on any error no extension is kept, so nothing half-built loads."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if getattr(self, "editable_mode", False):
            self.inplace = True  # an editable install imports from the source tree: the .so files go there

    def run(self) -> None:
        try:
            super().run()
        except BaseException as e:  # noqa: BLE001  (compiler errors surface as SystemExit/DistutilsError)
            if isinstance(e, KeyboardInterrupt):
                raise
            self._give_up(e)

    def _give_up(self, e: BaseException) -> None:
        sys.stderr.write(WARNING.format(f"{type(e).__name__}: {e}"))
        traceback.print_exc(file=sys.stderr)
        for ext in self.extensions:  # the shared C library and every module's shim go together or not at all
            for path in (self.get_ext_fullpath(ext.name), self._inplace_path(ext.name)):
                if path and os.path.exists(path):
                    os.remove(path)
        self.extensions = []

    def _inplace_path(self, name: str) -> str | None:
        parts = name.split(".")
        filename = os.path.basename(self.get_ext_filename(name))
        return os.path.join(os.path.dirname(os.path.abspath(__file__)), *parts[:-1], filename)

    def get_outputs(self) -> list[str]:
        return [p for p in super().get_outputs() if os.path.exists(p)] if self.extensions else []


def ext_modules() -> list:
    if os.environ.get("POOLSIM_NO_COMPILE") == "1":
        return []
    try:
        from mypyc.build import mypycify

        paths = [m.replace(".", "/") + ".py" for m in COMPILED_MODULES]
        return mypycify(["--config-file", "mypyc.ini", *paths], opt_level="3")
    except BaseException as e:  # noqa: BLE001  (mypyc reports type errors with SystemExit)
        if isinstance(e, KeyboardInterrupt):
            raise
        sys.stderr.write(WARNING.format(f"{type(e).__name__}: {e}"))
        return []


setup(ext_modules=ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
