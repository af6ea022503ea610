"""The same trace through the numpy pools (the simulator) and the torch pools (what a device runs): the step and
request tables must be identical, byte for byte, with every pool checked after every step."""

import numpy as np
import pytest

from poolsim.pools import MambaCacheParams, MambaStateShape
from poolsim.sim.scheduler import SchedulerConfig
from poolsim.sim.server import MambaConfig
from tests.helpers import TraceReq, run_sim

pytest.importorskip("torch")


def shared_prefix_trace(n=60, seed=0):
    rng = np.random.default_rng(seed)
    system = [list(rng.integers(0, 1000, 200)) for _ in range(3)]
    t, trace = 0.0, []
    for i in range(n):
        t += float(rng.exponential(0.02))
        prompt = system[i % 3] + list(rng.integers(0, 1000, int(rng.integers(10, 300))))
        trace.append(TraceReq(i, t, prompt, int(rng.integers(5, 60))))
    return trace


@pytest.mark.parametrize("page_size,pool", [(1, 1500), (4, 1200), (16, 1504)])
@pytest.mark.parametrize("overlap", [True, False])
def test_numpy_and_torch_pools_run_the_same_steps(page_size, pool, overlap):
    cfg = SchedulerConfig(page_size=page_size, max_total_num_tokens=pool, max_running_requests=16, context_len=2048,
                          chunked_prefill_size=256, enable_overlap=overlap)
    trace = shared_prefix_trace()
    steps_np, reqs_np, _ = run_sim(trace, cfg)
    steps_pt, reqs_pt, sched = run_sim(trace, cfg, device="cpu")
    assert type(sched.req_to_token_pool.req_to_token).__module__.startswith("torch")
    assert steps_np["evicted_tokens"].sum() > 0  # the pool was under pressure
    assert steps_np.to_csv(index=False) == steps_pt.to_csv(index=False)
    assert reqs_np.to_csv(index=False) == reqs_pt.to_csv(index=False)


@pytest.mark.parametrize("strategy,buffers", [("no_buffer", 0), ("extra_buffer", 2)])
def test_hybrid_pools_agree_too(strategy, buffers):
    params = MambaCacheParams(shape=MambaStateShape.kimi_linear(tp=1, num_heads=2, head_dim=4), layers=[0, 1])
    mamba = MambaConfig(max_mamba_cache_size=40, cache_params=params, strategy=strategy,
                        ping_pong_track_buffer_size=buffers, mamba_track_interval=64)
    cfg = SchedulerConfig(page_size=1, max_total_num_tokens=1500, max_running_requests=12, context_len=2048,
                          chunked_prefill_size=256, enable_overlap=buffers > 0)
    trace = shared_prefix_trace(seed=1)
    a = run_sim(trace, cfg, mamba=mamba)
    b = run_sim(trace, cfg, mamba=mamba, device="cpu")
    assert a[1]["cached_tokens_first"].sum() > 0  # prefix hits through the mamba tree happened
    assert a[0].to_csv(index=False) == b[0].to_csv(index=False)
    assert a[1].to_csv(index=False) == b[1].to_csv(index=False)
