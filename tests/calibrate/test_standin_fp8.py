"""fp8 KV in the stand-in forward: the uint8 pools hold SGLang's bytes (a torch cast to fp8 at unit scale, viewed as
uint8), q stays in the model dtype for the ops to cast, and a tiny calibrate run with --kv-cache-dtype fp8_e4m3 keeps
every pool check for an MHA and an MLA (+KDA) model."""

import json

import pytest
from typer.testing import CliRunner

from poolsim.cli import app
from tests.calibrate.util import generate_trace

torch = pytest.importorskip("torch")

from poolsim.kernels.replay import CpuTimer  # noqa: E402
from poolsim.kernels.standin import KV_SCALE, Dims, StandInForward, StepInputs, kv_torch_dtype, select_layers  # noqa: E402

runner = CliRunner()
SMALL = ["--max-total-tokens", "16000", "--context-length", "4096"]


def test_kv_dtype_names_and_unit_scale():
    assert kv_torch_dtype("fp8_e4m3") == torch.float8_e4m3fn and kv_torch_dtype("fp8_e5m2") == torch.float8_e5m2
    assert kv_torch_dtype("bfloat16") is None and kv_torch_dtype("float32") is None
    assert KV_SCALE == 1.0  # SGLang's k_scale/v_scale without checkpoint scales (quantization/kv_cache.py:59-63)


def _forward(model, dims, layer_ids, dtype_name):
    from poolsim.pools.mem_cache.pool.mha import MHATokenToKVPool
    from poolsim.pools.mem_cache.pool.mla import MLATokenToKVPool

    if model.use_mla:
        kv = MLATokenToKVPool(100, 1, dtype_name, dims.kv_lora_rank, dims.qk_rope, 1, device="cpu")
    else:
        kv = MHATokenToKVPool(100, 1, dtype_name, dims.kv_heads, dims.head_dim, 1, device="cpu",
                              v_head_dim=dims.v_head_dim)
    table = torch.zeros(3, 16, dtype=torch.int32)
    table[1, :4], table[2, :3] = torch.tensor([5, 6, 7, 9]), torch.tensor([11, 12, 20])
    fwd = StandInForward(model, dims, layer_ids, "cpu", torch.float32, seed=3, kv_pool=kv, req_to_token=table,
                         kv_dtype=kv_torch_dtype(dtype_name))
    return fwd, kv


@pytest.mark.parametrize("model_name", ["llama-3.1-8b", "deepseek-v3"])  # MHA (GQA); MLA
def test_fp8_pool_holds_the_cast_bytes(model_name):
    """The first layer's K/V (MLA: latent) depend only on the embedding, so the fp8 run and an fp32 run store the
    same values; SGLang's set_kv_buffer casts them to fp8 (x / 1.0) and stores the bytes: the fp8 pool must equal the
    fp32 pool cast to float8_e4m3fn, viewed as uint8, at every written slot, and hold zero everywhere else."""
    from poolsim.pools.model.config import ModelConfig

    model = ModelConfig.load(model_name)
    dims = Dims.tiny(model)
    layer_ids = [0]  # one attention + dense layer
    t = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
    prefill = StepInputs(t([1, 2]), t([0, 0]), t([3, 2]), t([5, 6, 7, 11, 12]), t([]), t([]), t([]), None, None)
    decode = StepInputs(t([]), t([]), t([]), t([]), t([1, 2]), t([4, 3]), t([9, 20]), None, None)
    runs = {}
    for name in ("float32", "fp8_e4m3"):
        fwd, kv = _forward(model, dims, layer_ids, name)
        logits = [fwd.forward(inp, CpuTimer("cpu"), step_seed=i) for i, inp in enumerate((prefill, decode))]
        assert all(bool(torch.isfinite(x).all()) for x in logits) and logits[1].shape == (2, dims.vocab)
        runs[name] = kv
    bufs = {n: (kv.kv_buffer if model.use_mla else kv.k_buffer + kv.v_buffer) for n, kv in runs.items()}
    written = [5, 6, 7, 9, 11, 12, 20]
    for f32, fp8 in zip(bufs["float32"], bufs["fp8_e4m3"]):
        assert fp8.dtype == torch.uint8
        want = torch.zeros_like(fp8)
        want[written] = f32[written].to(torch.float8_e4m3fn).view(torch.uint8)
        assert f32[written].abs().min() > 0 and torch.equal(fp8, want)


@pytest.mark.parametrize("model", ["llama-3.1-8b", "kimi-linear-48b-a3b"])  # MHA; MLA + KDA
def test_calibrate_tiny_fp8_kv(tiny_fp8_trace, tmp_path, model):
    out = tmp_path / "cal"
    res = runner.invoke(app, ["calibrate", str(tiny_fp8_trace), "--model", model, "--gpu", "H200", *SMALL,
                              "--kv-cache-dtype", "fp8_e4m3", "--device", "cpu", "--tiny", "--max-steps", "6",
                              "--triton-steps", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rec = json.loads((out / "calibration.json").read_text())
    assert rec["server_args"]["kv_cache_dtype"] == "fp8_e4m3"
    assert rec["pool_check"]["mismatches"] == 0 and rec["pool_check"]["guard_slots"] == "untouched"
    assert rec["pool_check"]["triton_steps"] == 1 and rec["replay"]["measured"] == 6


@pytest.fixture(scope="module")
def tiny_fp8_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "tiny.jsonl"
    return generate_trace(path, "--sessions", "3", "--rate", "6", "--turns", "fixed:1",
                          "--system-prompt-len", "60", "--input-len", "uniform:20,80", "--output-len",
                          "uniform:3,6")
