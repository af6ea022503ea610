"""The public ops pick the reference on CPU tensors, Triton on CUDA ones, and can be forced."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from poolsim import kernels
from tests.kernels.utils import DEVICE, ON_GPU

ROOT = Path(__file__).resolve().parents[2]


def test_auto_picks_by_device():
    t = torch.zeros(1, device=DEVICE)
    expected = "fused" if ON_GPU and kernels.HAS_TRITON else "naive"
    for op in ("kda_decode", "extend_attention", "conv1d_prefill"):  # every op has a Triton version
        assert kernels.implementation(op, t) == expected
        assert kernels.implementation(op, torch.zeros(1)) == "naive"


def test_use_backend_forces_and_restores():
    t = torch.zeros(1)
    with kernels.use_backend("fused"):
        assert kernels.implementation("store_kv", t) == "fused"
        with kernels.use_backend("naive"):
            assert kernels.implementation("store_kv", t) == "naive"
        assert kernels.implementation("store_kv", t) == "fused"
    assert kernels.implementation("store_kv", t) == "naive"
    with pytest.raises(ValueError):
        kernels.set_backend("cuda")


@pytest.mark.parametrize("backend", ["naive", "fused"])
def test_public_ops_run(backend):
    """Every public op through the dispatcher, forced each way, agrees with the reference (interpreter on CPU)."""
    if backend == "fused":
        pytest.importorskip("triton")
    torch.manual_seed(42)
    d = DEVICE
    table = torch.full((3, 8), -1, dtype=torch.int32, device=d)
    kb, vb = torch.randn(10, 1, 16, device=d), torch.randn(10, 1, 16, device=d)
    pool = torch.randn(4, 2, 16, 16, device=d)
    conv = torch.randn(4, 3, 96, device=d)
    q, k, v = (torch.randn(2, 2, 16, device=d) for _ in range(3))
    a, b = torch.randn(2, 32, device=d), torch.randn(2, 2, device=d)
    A_log, dt_bias = torch.zeros(2, device=d), torch.zeros(32, device=d)
    slots = torch.tensor([1, 3], device=d)
    results = {}
    for name in ("naive", backend):
        with kernels.use_backend(name):
            t, kk, vv, p, c = table.clone(), kb.clone(), vb.clone(), pool.clone(), conv.clone()
            kernels.write_req_to_token(t, torch.tensor([1, 2], device=d), torch.tensor([0, 0], device=d),
                                       torch.tensor([3, 2], device=d), torch.tensor([4, 5, 6, 7, 8], device=d))
            kernels.store_kv(kk, vv, torch.tensor([9, 2], device=d), k[:, :1], v[:, :1])
            o_att = kernels.decode_attention(q[:, :1], kk, vv, t, torch.tensor([1, 2], device=d),
                                             torch.tensor([3, 2], device=d))
            o_kda = kernels.kda_decode(q, k, v, a, b, A_log, dt_bias, p, slots)
            y = kernels.conv1d_update(torch.randn(2, 96, generator=torch.Generator().manual_seed(0)).to(d),
                                      c.transpose(-1, -2), torch.ones(96, 4, device=d), None, slots)
            o_ext = kernels.extend_attention(q[:, :1], kk, vv, t, torch.tensor([1, 2], device=d),
                                             torch.tensor([1, 0], device=d), torch.tensor([1, 1], device=d))
            y_pre = kernels.conv1d_prefill(torch.ones(3, 96, device=d), c.transpose(-1, -2),
                                           torch.ones(96, 4, device=d), None, slots, torch.tensor([0, 2, 3], device=d))
            results[name] = (t, kk, vv, p, c, o_att, o_kda, y, o_ext, y_pre)
    for ref, out in zip(results["naive"], results[backend]):
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_import_without_triton():
    """``import kernels`` works and runs the references when triton cannot be imported."""
    code = ("import sys; sys.modules['triton'] = None\n"
            "import torch, kernels\n"
            "assert not kernels.HAS_TRITON\n"
            "pool = torch.zeros(3, 1, 4, 4)\n"
            "o = kernels.kda_decode(torch.ones(1, 1, 4), torch.ones(1, 1, 4), torch.ones(1, 1, 4),\n"
            "    torch.zeros(1, 4), torch.zeros(1, 1), torch.zeros(1), torch.zeros(4), pool, torch.tensor([2]))\n"
            "assert o.shape == (1, 1, 4) and pool[2].abs().sum() > 0\n"
            "print('ok')\n")
    env = {k: v for k, v in os.environ.items() if k != "POOLSIM_KERNELS"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
