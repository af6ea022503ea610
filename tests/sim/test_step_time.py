"""The analytic step-time model: its documented formula worked by hand, its limits, calibration files."""

import json

import pytest

from pools.gpu_catalog import get_gpu
from pools.model_config import ModelConfig
from pools.server_args import ServerArgs
from pools.sizing import plan_memory
from sim.schedule_batch import ScheduleBatch
from sim.step_time import AnalyticStepTime, Coefficients, FixedStepTime, ModelCost


def cost(name="llama-3.1-8b", gpu="H100", **args):
    model, card = ModelConfig.load(name), get_gpu(gpu)
    return ModelCost.from_model(model, card, plan_memory(model, card, ServerArgs(**args)))


def decode_batch(seq_lens):
    b = ScheduleBatch([object()] * len(seq_lens), None, None, "decode")
    b.decode_seq_lens = list(seq_lens)
    return b


def prefill_batch(prefix_lens, extend_lens):
    b = ScheduleBatch([object()] * len(extend_lens), None, None, "extend")
    b.prefix_lens, b.extend_lens = list(prefix_lens), list(extend_lens)
    return b


def test_llama_8b_single_decode_is_bandwidth_bound_by_hand():
    c = cost()
    # Llama-3.1-8B: 8,030,261,248 bf16 parameters = 16,060,522,496 B read per step; KV cell
    # 8 heads x (128 + 128) x 32 layers x 2 B = 131,072 B/token, read for 1000 context tokens, written for 1.
    assert c.dense_weight_bytes == 16_060_522_496 and c.expert_weight_bytes == 0
    assert c.kv_cell_bytes == 131_072
    nbytes = 16_060_522_496 + 131_072 * (1000 + 1)
    memory_s = nbytes / (3.35e12 * 0.75)  # H100 SXM HBM3 3.35 TB/s x BW_EFFICIENCY
    t = AnalyticStepTime(c)(decode_batch([1000]))
    assert t == pytest.approx(memory_s + 0.0015, rel=1e-12)  # + OVERHEAD_S; compute is far below memory
    assert 0.0075 < t < 0.0085  # ~8 ms per token, what SGLang reaches for batch-1 Llama-8B decode on an H100


def test_large_prefill_is_compute_bound():
    c = cost()
    model = AnalyticStepTime(c)
    t = model(prefill_batch([0], [8192]))
    # GEMMs alone: 2 x active params x 8192 tokens at 55 % of 989 TFLOP/s
    gemm_s = 2 * c.active_params * 8192 / (989e12 * 0.55)
    assert t > gemm_s and t < 2 * gemm_s


def test_time_grows_with_work_and_is_deterministic():
    model = AnalyticStepTime(cost())
    assert model(decode_batch([1000] * 64)) > model(decode_batch([1000] * 8)) > model(decode_batch([1000]))
    assert model(decode_batch([4000] * 8)) > model(decode_batch([1000] * 8))
    assert model(prefill_batch([0], [4096])) == model(prefill_batch([0], [4096]))


def test_kda_state_traffic_counts_per_request():
    c = cost("kimi-linear-48b-a3b", "H200")
    assert c.state_bytes == 43_417_600  # one request's KDA state (SGLANG_SPEC.md 7.3)
    model = AnalyticStepTime(c)
    extra = model(decode_batch([10] * 65)) - model(decode_batch([10] * 64))
    # one more request reads and writes its 41.4 MiB state: >= 2 x 43.4 MB at 75 % of 4.8 TB/s = 24 us
    assert extra >= 2 * 43_417_600 / (4.8e12 * 0.75)


def test_moe_reads_only_the_experts_a_small_batch_touches():
    c = cost("qwen3-30b-a3b", "H100")
    assert c.num_experts == 128 and c.top_k == 8 and c.expert_weight_bytes > c.dense_weight_bytes
    model = AnalyticStepTime(c)
    assert model(decode_batch([100])) < model(decode_batch([100] * 64))


def test_tp_adds_all_reduce_time():
    one = AnalyticStepTime(cost("llama-3.1-70b", "H100", tp_size=8))
    assert one.cost.tp == 8
    # 80 layers x 2 all-reduces, each 2 x 7/8 x (1 token x 8192 x 2 B) / 450 GB/s + 8 us latency
    per = 2 * 7 / 8 * 8192 * 2 / 450e9 + 8e-6
    c = one.cost
    nbytes = c.dense_weight_bytes + c.kv_cell_bytes * (100 + 1)
    assert one(decode_batch([100])) == pytest.approx(nbytes / (3.35e12 * 0.75) + 160 * per + 0.0015, rel=1e-9)


def test_calibration_file_replaces_coefficients(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"device": "NVIDIA H100", "date": "2026-11-29",
                                "coefficients": {"bw_efficiency": 0.9, "overhead_s": 0.002}}))
    k = Coefficients.from_calibration(path)
    assert (k.bw_efficiency, k.overhead_s, k.mfu) == (0.9, 0.002, 0.55)
    path.write_text(json.dumps({"coefficients": {"warp_speed": 9}}))
    with pytest.raises(ValueError, match="unknown coefficient"):
        Coefficients.from_calibration(path)
    path.write_text(json.dumps({"coefficients": {"mfu": -1}}))
    with pytest.raises(ValueError, match="positive"):
        Coefficients.from_calibration(path)
    path.write_text("not json")
    with pytest.raises(ValueError, match="not a poolsim calibration file"):
        Coefficients.from_calibration(path)


def test_fixed_step_time_rejects_nonsense():
    assert FixedStepTime(0.02)(None) == 0.02
    with pytest.raises(ValueError):
        FixedStepTime(0)
