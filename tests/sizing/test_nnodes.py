"""--nnodes: the tp x pp GPUs over nodes of the catalog's GPU system (gpus_per_node, scale-out link)."""

import json

import pytest

from poolsim.pools.errors import SizingError
from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.plan import plan_memory
from poolsim.pools.sizing.server_args import ServerArgs

H200 = get_gpu("H200")


def plan(name, gpu=H200, **flags):
    return plan_memory(ModelConfig.load(name), gpu, ServerArgs(**flags))


def test_catalog_systems():
    for name in ("h100", "h200", "b200"):
        g = get_gpu(name)
        assert (g.gpus_per_node, g.scale_out_bandwidth) == (8, 50e9)  # 8x ConnectX-7 400 Gb/s (DGX datasheets)
    assert get_gpu("a100").scale_out_bandwidth == 25e9  # ConnectX-6 HDR 200 Gb/s
    assert get_gpu("l40s").gpus_per_node is None


def test_two_nodes_of_8():
    p = plan("deepseek-v3", tp_size=8, pp_size=2, nnodes=2)
    assert p.layout.to_dict() == dict(tp=8, attn_tp=8, attn_dp=1, ep=1, pp=2, nnodes=2)
    assert p.gpus_per_node == 8 and "InfiniBand NDR" in p.scale_out and not p.warnings
    assert "2 x 8 GPUs (a node holds 8)" in p.table()


@pytest.mark.parametrize("flags, match", [
    (dict(tp_size=16, nnodes=3), "--nnodes 3 does not divide the --tp 16 x --pp-size 1 GPUs"),
    (dict(tp_size=16, pp_size=2, nnodes=2), "16 per node, more than the 8"),
    (dict(tp_size=8, dp_size=2, nnodes=2), "multi-node data-parallel replicas are not supported"),
])
def test_checks(flags, match):
    with pytest.raises(SizingError, match=match):
        plan("deepseek-v3", **flags)


def test_one_node_too_small_warns():
    p = plan("deepseek-v3", tp_size=16)
    assert p.warnings[0].endswith("SGLang needs --nnodes 2")


def test_no_node_size_for_pcie_cards():
    with pytest.raises(SizingError, match="no node size"):
        plan("qwen3-8b", get_gpu("l40s"), tp_size=2, nnodes=2)


def test_json_parallel():
    from typer.testing import CliRunner

    from poolsim.cli import app

    r = CliRunner().invoke(app, ["plan", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--pp-size", "2",
                                 "--nnodes", "2", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["parallel"] == dict(tp=8, attn_tp=8, attn_dp=1, ep=1, pp=2, nnodes=2)


@pytest.mark.parametrize("flags", [dict(tp_size=8, attn_dp_size=8), dict(tp_size=8, ep_size=8),
                                   dict(tp_size=8, pp_size=2, nnodes=2), dict(tp_size=8, nnodes=2)])
def test_run_refuses_what_it_does_not_simulate(flags):
    from poolsim.app.run import simulate

    with pytest.raises(ValueError, match="run does not yet simulate"):
        simulate([], ModelConfig.load("deepseek-v3"), H200, ServerArgs(**flags))
