"""poolsim sim."""

import pools  # noqa: F401  (first: it installs the POOLSIM_PURE_PYTHON switch before a sim module loads)

ROUTERS = ("round_robin", "cache_aware")  # the dp routers sim.engine models (of sgl-router's policies)
