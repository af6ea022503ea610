"""SGLang 0.5.23's scheduler, simulated: the batch, the prefill adder and policy, the event loop and the step time."""

ROUTERS = ("round_robin", "cache_aware")  # the dp routers sim.engine models (of sgl-router's policies)
