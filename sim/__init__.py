"""poolsim sim."""

ROUTERS = ("round_robin", "cache_aware")  # the dp routers sim.engine models (of sgl-router's policies)
