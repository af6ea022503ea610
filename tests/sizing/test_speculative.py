"""Issue #36: speculative decoding in the sizing. Expected values are derived by hand from SGLang 0.5.23's wheel:

- the target's cell grows by ``int(cell x draft_layers / target_layers)`` (model_executor/pool_configurator.py:255-314)
  and the draft's pool holds the target's token count (managers/scheduler.py:1097-1108);
- ``eagle_draft_num_layers`` comes from the draft's ``num_nextn_predict_layers``, else its layers
  (model_runner_components/spec_aux_hidden_state.py:132-196);
- the EAGLE family's defaults: max_running_requests 48 (arg_groups/speculative_hook.py:1086-1094) and
  ``_auto_choose_speculative_params`` (:1430-1461); topk 1 forces draft tokens = steps + 1 (:1255-1266);
- the decode reservation and the req_to_token headroom (mem_cache/allocation_sizing.py:28-116);
- the draft's weights are resident when the target's pool is sized (scheduler.py:1077-1108).
"""

import json
import math

import pytest
from typer.testing import CliRunner

from poolsim.cli import app
from poolsim.pools.hardware.gpu_catalog import get_gpu
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.plan import SizingError, plan_memory
from poolsim.pools.sizing.server_args import ServerArgs
from poolsim.pools.sizing.speculative import resolve_speculative

GIB = 2**30
H100, H200, B200 = get_gpu("h100"), get_gpu("h200"), get_gpu("b200")
runner = CliRunner()

# A small EAGLE3 head for Llama-3.1-8B, as yuhuili/EAGLE3-LLaMA3.1-Instruct-8B lays it out: one layer of the target's
# attention geometry, the target's vocabulary for its embedding, a 32000-token head.
EAGLE3_LLAMA_8B = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 4096, "intermediate_size": 14336,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 1, "vocab_size": 128256,
                   "draft_vocab_size": 32000, "torch_dtype": "bfloat16", "max_position_embeddings": 2048,
                   "rms_norm_eps": 1e-05}


@pytest.fixture
def eagle3_draft(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(EAGLE3_LLAMA_8B))
    return str(path)


def plan(name, gpu, **flags):
    return plan_memory(ModelConfig.load(name), gpu, ServerArgs(**flags))


def fp8(out, inp):
    """An fp8 block-quantized weight on one rank: 1 B per value plus a float32 scale per 128 x 128 block."""
    return out * inp + math.ceil(out / 128) * math.ceil(inp / 128) * 4


# ---- DeepSeek-V3 NEXTN on 8 x H200 ---------------------------------------------------------------


def test_deepseek_v3_nextn_plan_hand_derived():
    with_spec = plan("deepseek-v3", H200, tp_size=8, speculative_algorithm="NEXTN")
    without = plan("deepseek-v3", H200, tp_size=8)
    sp = with_spec.speculative
    # NEXTN is EAGLE on the checkpoint's own NextN layer; DeepSeek-V3 auto-picks (3 steps, topk 1, 4 tokens)
    assert (sp.algorithm, sp.requested, sp.nextn) == ("EAGLE", "NEXTN", True)
    assert (sp.num_steps, sp.eagle_topk, sp.num_draft_tokens, sp.auto_params) == (3, 1, 4, True)
    assert (sp.draft_layers, sp.draft_pool_layers, sp.draft_architecture) == (1, 1, "DeepseekV3ForCausalLMNextN")
    # MLA cell: (kv_lora_rank 512 + rope 64) x 61 layers x 2 B; the draft: one layer of it
    assert with_spec.cell_size_bytes == 576 * 61 * 2 == 70_272
    assert sp.reserved_cell_bytes == int(70_272 * 1 / 61) == 1_152 == sp.draft_cell_bytes
    # the NextN layer at tp 8: own embedding and head (vocab 129280 / 8), eh_proj (2h -> h, bf16, replicated),
    # enorm/hnorm/shared_head.norm, MLA attention (fp8 blocks), one sparse layer of 256 experts + 1 shared
    h, emb = 7168, 129280 // 8 * 7168 * 2
    nextn = (2 * emb + 3 * h * 2 + 1536 * 2 + 512 * 2 + 3 * h * 2 + h * 2 * h * 2
             + fp8(1536, h) + fp8(24576 // 8, 1536) + fp8(576, h) + fp8(32768 // 8, 512) + fp8(h, 16384 // 8)
             + 4096 * 512 * 2  # w_kc / w_vc, bf16 copies of kv_b_proj
             + 256 * h * 2 + 256 * 4 + 256 * fp8(512, h) + 256 * fp8(h, 256) + fp8(512, h) + fp8(h, 256))
    assert nextn == 2_128_596_128
    assert sp.draft_weights_gib * GIB == nextn
    assert with_spec.weights_gib_per_rank == pytest.approx(without.weights_gib_per_rank + nextn / GIB, abs=1e-9)
    assert with_spec.rest_gib == pytest.approx(without.rest_gib - nextn / GIB, abs=1e-9)
    # tokens = budget // (cell + reserved); without the reservation, budget // cell
    budget = int(with_spec.rest_gib * GIB)
    assert with_spec.max_total_num_tokens == budget // (70_272 + 1_152) == 603_236
    assert sp.target_tokens_without_draft == budget // 70_272 == 613_125
    assert sp.target_token_reduction == 9_889 and sp.target_token_reduction_frac == pytest.approx(9_889 / 613_125)
    assert sp.draft_pool_tokens == 603_236
    assert sp.draft_pool_gib * GIB == (603_236 + 1) * 1_152  # size + page rows
    # the target's pool is a few percent smaller than without speculation (reservation and draft weights)
    assert without.max_total_num_tokens == 643_416
    assert 0.01 < 1 - with_spec.max_total_num_tokens / without.max_total_num_tokens < 0.08
    # 48 requests; rows are context + 4 + num_draft_tokens wide
    assert with_spec.max_running_requests == 48 == sp.max_running_requests and without.max_running_requests == 2048
    assert with_spec.max_context_len == 163_840 + 4 + 4
    assert (sp.alloc_len_per_decode, sp.alloc_reserve_per_decode) == (4, 8)
    assert sp.verify_buffer_reqs == 0 and sp.verify_buffers_gib == 0


def test_deepseek_v3_nextn_json_and_table():
    r = runner.invoke(app, ["plan", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8",
                            "--speculative-algorithm", "NEXTN", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    s = d["speculative"]
    assert (s["draft_layers"], s["draft_cell_bytes"], s["draft_pool_tokens"], s["target_token_reduction"]) == \
        (1, 1152, 603_236, 9_889)
    assert "verify_buffers_gib" in s and d["max_total_num_tokens"] == 603_236
    off = json.loads(runner.invoke(app, ["plan", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8",
                                         "--json"]).output)
    assert off["speculative"] is None
    table = runner.invoke(app, ["plan", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8",
                                "--speculative-algorithm", "NEXTN"]).output
    assert "speculative" in table and "draft KV pool" in table and "603,236 tokens x 1,152 B" in table


def test_deepseek_v32_dsa_draft_reserves_latent_and_index_rows():
    p = plan("deepseek-v3.2", H200, tp_size=8, speculative_algorithm="NEXTN")
    # bf16 latent (512 + 64) x 2 B and the index-K row 128 + 128 / 128 x 4 per layer (pool_configurator.py:274-302)
    assert p.cell_size_bytes == (1152 + 132) * 61 == 78_324
    assert p.speculative.reserved_cell_bytes == int(1152 * 61 * 1 / 61) + 132 * 1 == 1_284
    assert p.speculative.draft_cell_bytes == 1_284
    budget = int(p.rest_gib * GIB)
    assert p.max_total_num_tokens == budget // (78_324 + 1_284) // 64 * 64


# ---- an EAGLE3 dense plan: Llama-3.1-8B on one H100 --------------------------------------------------


def test_eagle3_llama_plan_hand_derived(eagle3_draft):
    with_spec = plan("llama-3.1-8b", H100, speculative_algorithm="EAGLE3", speculative_draft_model_path=eagle3_draft)
    without = plan("llama-3.1-8b", H100)
    sp = with_spec.speculative
    # Llama targets auto-pick (5 steps, topk 4, 8 draft tokens)
    assert (sp.algorithm, sp.num_steps, sp.eagle_topk, sp.num_draft_tokens) == ("EAGLE3", 5, 4, 8)
    assert (sp.draft_layers, sp.draft_pool_layers, sp.nextn) == (1, 1, False)
    # GQA cell: 8 KV heads x (128 + 128) x 32 layers x 2 B; the draft's own pool: 8 x 256 x 1 x 2
    assert with_spec.cell_size_bytes == 131_072
    assert sp.reserved_cell_bytes == int(131_072 * 1 / 32) == 4_096 == sp.draft_cell_bytes
    # the head's weights at tp 1: embedding (128256 x 4096), 3 norms + hidden_norm, q/k/v over 2 x hidden,
    # o_proj, the SwiGLU MLP, fc (3 x 4096 -> 4096) and a 32000-token lm_head, all bf16
    h = 4096
    head = (128_256 * h * 2 + 3 * h * 2 + h * 2
            + 2 * (h * h + 2 * 1024 * h) * 2 + h * h * 2
            + 2 * 14_336 * h * 2 + h * 14_336 * 2
            + h * 3 * h * 2 + 32_000 * h * 2)
    assert sp.draft_weights_gib * GIB == head == 1_900_052_480
    budget = int(with_spec.rest_gib * GIB)
    assert with_spec.max_total_num_tokens == budget // (131_072 + 4_096) == 384_221
    assert sp.target_tokens_without_draft == budget // 131_072 == 396_228
    assert sp.target_token_reduction_frac == pytest.approx(1 - 384_221 / 396_228)  # ~3 %: 1 / 33 of the cell
    assert without.max_total_num_tokens == 410_724
    # decode: max(steps x topk, draft tokens) = 20 slots, reserved twice; rows: context + 4 + 8
    assert (sp.alloc_len_per_decode, sp.alloc_reserve_per_decode, sp.req_to_token_extra_context) == (20, 40, 12)
    assert with_spec.max_context_len == 131_072 + 12
    assert with_spec.max_running_requests == 48
    # topk unset on the command line: the Hopper MHA default (fa3) stands (model_override_base.py:300-311)
    assert with_spec.attention_backend == "fa3"


def test_decode_reservation_and_row_headroom_at_page_64(eagle3_draft):
    # page > 1 and topk > 1: ceil((ps - 1 + steps + ps - 1) / ps) pages per branch, for each of topk branches
    p = plan("llama-3.1-8b", H100, page_size=64, speculative_algorithm="EAGLE3",
             speculative_draft_model_path=eagle3_draft, speculative_num_steps=5, speculative_eagle_topk=4,
             speculative_num_draft_tokens=8)
    assert p.attention_backend == "flashinfer"  # topk > 1 given at page 64: not fa3
    sp = p.speculative
    assert sp.alloc_len_per_decode == max((63 + 5 + 63) // 64 * 64 * 4, 8) == 512
    assert sp.req_to_token_extra_context == max(4 + 8, 2 * 512 + 63) == 1_087
    # topk 1 at page 64: max(steps, steps + 1) slots, and the page's rounding on top of the reservation
    p1 = plan("llama-3.1-8b", H100, page_size=64, speculative_algorithm="EAGLE3",
              speculative_draft_model_path=eagle3_draft, speculative_num_steps=3, speculative_eagle_topk=1)
    assert (p1.speculative.num_draft_tokens, p1.speculative.alloc_len_per_decode) == (4, 4)
    assert p1.speculative.req_to_token_extra_context == max(4 + 4, 8 + 63) == 71


def test_explicit_max_running_requests_is_kept(eagle3_draft):
    p = plan("llama-3.1-8b", H100, max_running_requests=200, speculative_algorithm="EAGLE3",
             speculative_draft_model_path=eagle3_draft)
    assert p.max_running_requests == 200


def test_blackwell_mha_backend_follows_the_flags_as_given(eagle3_draft):
    # speculation on, topk unset: not trtllm_mha (is_no_spec_infer_or_topk_one and topk given), FlashInfer
    auto = plan("llama-3.1-8b", B200, speculative_algorithm="EAGLE3", speculative_draft_model_path=eagle3_draft)
    assert (auto.attention_backend, auto.page_size) == ("flashinfer", 1)
    topk1 = plan("llama-3.1-8b", B200, speculative_algorithm="EAGLE3", speculative_draft_model_path=eagle3_draft,
                 speculative_num_steps=3, speculative_eagle_topk=1)
    assert (topk1.attention_backend, topk1.page_size) == ("trtllm_mha", 64)


# ---- hybrids ----------------------------------------------------------------------------------------


def test_gpt_oss_eagle3_draft_sits_on_the_full_side(tmp_path):
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 2880, "intermediate_size": 17280,
           "head_dim": 64, "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 1,
           "vocab_size": 201088, "torch_dtype": "bfloat16"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    p = plan("gpt-oss-120b", H200, speculative_algorithm="EAGLE3", speculative_draft_model_path=str(path))
    # 8 KV heads x (64 + 64) x 2 B = 2048 B per layer on both sides: 18 full + 0.8 x 18 SWA, the draft on the full side
    assert p.speculative.reserved_cell_bytes == 8 * (64 + 64) * 2 == 2_048
    budget = int(p.rest_gib * GIB)
    assert p.max_total_num_tokens == int(budget // (2048 * 18 + 0.8 * 2048 * 18 + 2048))


def test_qwen3_next_mtp_joint_mamba_solve_and_verify_buffers():
    m = ModelConfig.load("qwen3-next-80b-a3b")
    with_path = plan_memory(m, H200, ServerArgs(tp_size=4, speculative_algorithm="NEXTN",
                                                  speculative_draft_model_path="qwen3-next-80b-a3b"))
    sp = with_path.speculative
    assert (sp.draft_layers, sp.draft_pool_layers, sp.draft_architecture) == (1, 1, "Qwen3NextForCausalLMMTP")
    per = with_path.mamba_bytes_per_slot
    # K = int((budget - per (1 + D)) // (per (1 + D / ratio))), D = 4 draft tokens, ratio 5 (extra_buffer, overlap)
    budget = with_path.rest_gib * 0.9 / 1.9 * GIB
    assert with_path.max_mamba_cache_size == int((budget - per * 5) // (per * (1 + 4 / 5)))
    # the buffers of min(48, K // 5) + 1 requests, per x D each
    assert sp.verify_buffer_reqs == 48 and sp.verify_buffers_gib * GIB == per * 49 * 4
    # 12 full layers of 1024 B at tp 4; the MTP layer reserves one more
    assert with_path.cell_size_bytes == 12_288 and sp.reserved_cell_bytes == 1_024
    # path-less: SGLang reads the *target's* num_nextn_predict_layers (none): nothing reserved, a note says so
    pathless = plan_memory(m, H200, ServerArgs(tp_size=4, speculative_algorithm="NEXTN"))
    assert pathless.speculative.reserved_cell_bytes == 0 and pathless.speculative.draft_pool_layers == 1
    assert any("reserves nothing" in n for n in pathless.speculative.notes)


# ---- refusals --------------------------------------------------------------------------------------


@pytest.mark.parametrize("flags, match", [
    (dict(speculative_algorithm="NGRAM"), "NGRAM: SGLang 0.5.23 accepts it, poolsim does not model it"),
    (dict(speculative_algorithm="DFLASH"), "DFLASH: SGLang 0.5.23 accepts it"),
    (dict(speculative_algorithm="MEDUSA"), "unknown to SGLang 0.5.23"),
    (dict(speculative_algorithm="EAGLE3"), "needs --speculative-draft-model-path"),
    (dict(speculative_num_steps=3), "needs --speculative-algorithm"),
    (dict(speculative_accept_length=2.0), "needs --speculative-algorithm"),
])
def test_refused_configurations(flags, match):
    with pytest.raises(SizingError, match=match):
        plan("llama-3.1-8b", H100, **flags)


@pytest.mark.parametrize("flags, match", [
    (dict(speculative_eagle_topk=4), "without --speculative-num-steps"),
    (dict(speculative_num_steps=3), "without --speculative-eagle-topk"),
    (dict(speculative_num_steps=3, speculative_eagle_topk=4), "needs --speculative-num-draft-tokens"),
    (dict(speculative_accept_length=4.5), r"commits 1 to num_steps \+ 1 = 4"),
    (dict(speculative_accept_length=2.0, speculative_accept_file="x.json"), "give one"),
])
def test_refused_speculative_flags(flags, match):
    with pytest.raises(SizingError, match=match):
        plan("deepseek-v3", H200, tp_size=8, speculative_algorithm="NEXTN", **flags)


def test_nextn_needs_nextn_layers():
    with pytest.raises(SizingError, match="num_nextn_predict_layers 0"):
        plan("kimi-k2", H200, tp_size=8, speculative_algorithm="NEXTN")


def test_topk_one_adjusts_draft_tokens(eagle3_draft):
    sp = resolve_speculative(ModelConfig.load("llama-3.1-8b"), ServerArgs(
        speculative_algorithm="EAGLE3", speculative_draft_model_path=eagle3_draft, speculative_num_steps=2,
        speculative_eagle_topk=1, speculative_num_draft_tokens=9))
    assert sp.num_draft_tokens == 3 and sp.max_accept_length == 3
    assert any("adjusted to speculative_num_steps + 1" in n for n in sp.notes)
