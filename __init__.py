"""poolsim: a capacity planner for LLM-serving memory, SGLang 0.5.23's pools, radix cache and scheduler, simulated.

The repository root is this package (setup.py): ``poolsim.pools`` (SGLang's memory machinery and sizing),
``poolsim.sim`` (the scheduler), ``poolsim.traces``, ``poolsim.reports``, ``poolsim.kernels``, ``poolsim.app``
(what a command does end to end) and ``poolsim.cli``.
"""

from poolsim.compiled import install_if_asked

install_if_asked()  # POOLSIM_PURE_PYTHON=1, or a source changed since the build: the .py sources, not the extensions
