"""Step-time models: map a scheduled batch to the seconds its forward pass takes on one tp group.

``AnalyticStepTime`` is a roofline per step on one tp rank (all ranks run the same shapes), plus the
fixed costs a roofline cannot see:

    t = max(compute, memory) + triton + launch + moe + linear + comm + step_overhead_s

    compute = dense flops / (peak x mfu[arch])                        dense GEMMs, attention
            + routed-expert flops / (peak x mfu[arch] x moe_gemm_efficiency)   MoE grouped GEMM
        dense flops  = 2 x (active params - active expert params)/tp x tokens
                     + attention pairs x flops_per_pair                  causal prefill: e x p + e(e+1)/2;
                                                                         decode: seq_len per request
                     + linear-attention tokens x 6 x H/tp x K x V x L_lin   KDA/GDN state update
    memory  = bytes / (hbm_bandwidth x hbm_efficiency[arch])
        bytes = dense weights + routed-expert weights x (share of experts the batch touches)
              + context tokens x KV cell bytes + new tokens x KV cell bytes + 2 x state bytes per request
    triton  = full-attention layers x (mean decode seq_len x triton_decode_token_layer_s
                                       + sum of decode seq_lens x triton_decode_kv_token_layer_s)
              (--attention-backend triton only): SGLang's Triton decode kernel splits each request's KV
              into at most num_kv_splits chunks of one CTA each, so a small batch leaves most SMs idle and
              the kernel's time follows one request's length (latency); a large batch fills the SMs and
              its time follows the batch's KV tokens at the kernel's own rate, far below HBM bandwidth
    launch  = layers x (graph_layer_s[arch]  if the step replays a CUDA graph: decode batches up to
                                               SGLang's cuda_graph_max_bs; prefill where the prefill graph is on
                        eager_layer_s[arch]  otherwise: kernel launches and Python per layer)
            + layers x fp8_layer_s[arch] with FP8 linear layers (activation quantization per GEMM)
    moe     = MoE layers x tokens x moe_token_layer_s                  top-k routing, permute/unpermute
            + EP all-to-all: 2 x MoE layers x tokens x top_k x hidden x 2 B x (ep-1)/ep / link
              (ep from ServerArgs.ep_size where present; poolsim has no --ep flag yet, so it is off)
    linear  = linear layers x prefill tokens x linear_prefill_token_layer_s   chunked KDA/GDN/Mamba2
                                                                              scan + causal conv in prefill
    comm    = 2 all-reduces per layer of tokens x hidden x 2 B:
              2 (tp-1)/tp x bytes / (GPU link bandwidth x link_efficiency) + allreduce_latency_s

Speculative decoding (EAGLE v2, ``speculative/eagle_worker_v2.py:1416-1500``) makes a decode step three kinds of
forward pass, each priced by the same terms (everything but ``step_overhead_s``, paid once per step):

    t = verify + (num_steps - 1) x draft decode + draft extend + step_overhead_s
    verify        the target over D = num_draft_tokens tokens per request: a small extend, D x bs tokens through
                  the weights (compute-bound at large batch, weight-bound at small; MoE touches more experts),
                  attending to the committed KV plus the draft tree (D x seq_len + D (D + 1) / 2 pairs), replayed
                  in the decode CUDA graph up to cuda_graph_max_bs
    draft decode  the draft over topk tokens per request (draft steps 1 .. num_steps - 1; the last step's topk
                  needs no forward), attending to seq_len + its step
    draft extend  the draft over the D verified tokens per request: its KV for the accepted run and the next
                  round's first candidates
    prefill       the target's extend plus the draft's extend over the same tokens

The draft is priced from its own weights and KV cell (a NextN layer, an EAGLE head); its embedding is a lookup,
so its bytes are not streamed (the target's fitted term keeps its own). No coefficient is speculative: the terms
carry to any draft and target nobody fitted.

``request_cpu_s`` is not GPU time: it is what a request spends outside the forward passes (HTTP,
tokenizer, scheduler admission, detokenizer), which bench_serving counts inside TTFT and E2E.

The defaults are fitted to published SGLang runs (bench/data/published_runs.csv, fit by
bench/time_accuracy.py --fit on its deterministic training half); FIT_BOUNDS gives each coefficient's
plausible range. A calibration file measured on the GPU (``--calibration FILE``) replaces them.
No coefficient is keyed on a model or benchmark name; those keyed on a GPU architecture carry to
every GPU of that architecture. The same batch always gives the same time.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path

from poolsim.pools.hardware.gpu_catalog import ARCHS

# What each coefficient is, and where its value comes from.
DESCRIPTIONS = {
    **{f"hbm_efficiency_{a}": f"achieved / datasheet HBM bandwidth on {a}, streaming weights and KV in decode"
       for a in ARCHS},
    **{f"mfu_{a}": f"achieved / dense peak FLOP/s on {a} in prefill GEMMs and attention" for a in ARCHS},
    "moe_gemm_efficiency": "MoE grouped-GEMM throughput relative to a dense GEMM of the same flops",
    **{f"graph_layer_s_{a}": f"s per layer of a step that replays a CUDA/HIP graph on {a} (kernel gaps)"
       for a in ARCHS},
    **{f"eager_layer_s_{a}": f"s per layer of an eager step on {a} (launches, Python, allocator)" for a in ARCHS},
    **{f"fp8_layer_s_{a}": f"s per layer per step on {a} when the linear layers are FP8: the activation "
                            "quantization kernels each FP8 GEMM adds" for a in ARCHS},
    "step_overhead_s": "s per step: sampling, scheduler work the overlap scheduler does not hide",
    "moe_token_layer_s": "s per token per MoE layer: top-k routing, permute and unpermute",
    "linear_prefill_token_layer_s": "s per prefill token per linear-attention layer: chunked KDA/GDN/Mamba2 "
                                    "scan and causal conv",
    "triton_decode_token_layer_s": "s per decode context token per full-attention layer, at the mean sequence "
                                   "length of the batch, with --attention-backend triton (split-KV kernel: "
                                   "latency in proportion to a request's length at small batch)",
    "triton_decode_kv_token_layer_s": "s per decode KV token of the batch per full-attention layer with "
                                      "--attention-backend triton (the split-KV kernel's rate once the batch "
                                      "fills the SMs)",
    # Both Triton terms are fitted on SGLang 0.5.6-0.5.7 runs (GLM-4.7-Flash on B200 is the only training model
    # with --attention-backend triton at several lengths). 0.5.23 raises an MLA model's split cap towards the SM
    # count (triton_backend.py:83-90, 325-338), which should shrink the latency term for MLA there: not measured.
    "link_efficiency": "achieved / datasheet link bandwidth in all-reduce and all-to-all",
    "allreduce_latency_s": "s per small all-reduce (SGLang's custom all-reduce kernel; not fitted: no published "
                           "case resolves it)",
    "request_cpu_s": "s per request outside the GPU: HTTP, tokenizer, scheduler admission, detokenizer",
}

# The values before any fit, and what the fit starts from (so a fit is reproducible): the usual rule-of-thumb
# efficiencies of serving kernels (75 % of HBM bandwidth, 55 % MFU), a few us of gap per layer in a replayed
# graph and ~10 launches of ~15 us per layer eager, 1.5 ms per step and 60 ms per request of CPU work.
PRIORS = {
    **{f"hbm_efficiency_{a}": 0.75 for a in ARCHS},
    **{f"mfu_{a}": 0.55 for a in ARCHS},
    "moe_gemm_efficiency": 0.5,
    **{f"graph_layer_s_{a}": 20e-6 for a in ARCHS},
    **{f"eager_layer_s_{a}": 150e-6 for a in ARCHS},
    **{f"fp8_layer_s_{a}": 10e-6 for a in ARCHS},
    "step_overhead_s": 1.5e-3,
    "moe_token_layer_s": 5e-9,
    "linear_prefill_token_layer_s": 20e-9,
    "triton_decode_token_layer_s": 5e-9,
    "triton_decode_kv_token_layer_s": 0.5e-9,
    "link_efficiency": 0.7,
    "allreduce_latency_s": 8e-6,
    "request_cpu_s": 0.06,
}

# Fitted values: the block between the markers is written by `python bench/time_accuracy.py --fit
# --write-defaults` from the training half of bench/data/published_runs.csv ("prior": no training case
# of that architecture publishes latencies, the pre-fit default stays; "at bound": the data pushes it to
# its FIT_BOUNDS edge, so the data does not resolve it).
# BEGIN FITTED DEFAULTS
DEFAULTS = {
    "hbm_efficiency_sm80": 0.4621,
    "hbm_efficiency_sm89": 0.75,  # prior
    "hbm_efficiency_sm90": 0.75,  # prior
    "hbm_efficiency_sm100": 0.5512,
    "hbm_efficiency_gfx942": 0.5229,
    "mfu_sm80": 0.6071,
    "mfu_sm89": 0.55,  # prior
    "mfu_sm90": 0.55,  # prior
    "mfu_sm100": 0.665,
    "mfu_gfx942": 0.147,
    "moe_gemm_efficiency": 0.1,  # at bound
    "graph_layer_s_sm80": 1e-06,  # at bound
    "graph_layer_s_sm89": 2e-05,  # prior
    "graph_layer_s_sm90": 2e-05,  # prior
    "graph_layer_s_sm100": 4.141e-05,
    "graph_layer_s_gfx942": 7.807e-05,
    "eager_layer_s_sm80": 0.0001601,
    "eager_layer_s_sm89": 0.00015,  # prior
    "eager_layer_s_sm90": 0.00015,  # prior
    "eager_layer_s_sm100": 0.0001611,
    "eager_layer_s_gfx942": 0.001,  # at bound
    "fp8_layer_s_sm80": 1e-05,  # prior
    "fp8_layer_s_sm89": 1e-05,  # prior
    "fp8_layer_s_sm90": 1e-05,  # prior
    "fp8_layer_s_sm100": 2.255e-05,
    "fp8_layer_s_gfx942": 0.000247,
    "step_overhead_s": 0.003213,
    "moe_token_layer_s": 1e-10,  # at bound
    "linear_prefill_token_layer_s": 1e-06,  # at bound
    "triton_decode_token_layer_s": 4.508e-08,
    "triton_decode_kv_token_layer_s": 1.79e-09,
    "link_efficiency": 1,  # at bound
    "allreduce_latency_s": 8e-06,  # prior
    "request_cpu_s": 0.08163,
}
MEASURED_ERROR = ('held-out median |error| 10% throughput, 19% TTFT (median TTFT 21%), 13% TPOT (full simulation '
                  'of 36 held-out published SGLang runs, warm-server replay, 2026-12-01; docs/time-model.md); '
                  'median signed error -9% throughput, -10% mean TTFT, +21% median TTFT, +11% TPOT')
# END FITTED DEFAULTS

# Plausible range of every fittable coefficient: the GPU calibration fit and bench/time_accuracy.py --fit
# stay inside these.
FIT_BOUNDS: dict[str, tuple[float, float]] = {
    **{f"hbm_efficiency_{a}": (0.2, 0.95) for a in ARCHS},
    **{f"mfu_{a}": (0.1, 0.85) for a in ARCHS},
    "moe_gemm_efficiency": (0.1, 1.0),
    # a replayed graph: kernel gaps of a few us per layer (AMD's HIP graphs replay slower: wider range)
    **{f"graph_layer_s_{a}": (1e-6, 300e-6 if a == "gfx942" else 50e-6) for a in ARCHS},
    **{f"eager_layer_s_{a}": (50e-6, 1e-3) for a in ARCHS},  # eager: >= ~10 launches of >= 5 us per layer
    **{f"fp8_layer_s_{a}": (1e-6, 500e-6) for a in ARCHS},
    "step_overhead_s": (1e-4, 10e-3),
    "moe_token_layer_s": (1e-10, 1e-6),
    "linear_prefill_token_layer_s": (1e-10, 1e-6),
    "triton_decode_token_layer_s": (1e-10, 1e-6),
    "triton_decode_kv_token_layer_s": (1e-12, 1e-7),
    "link_efficiency": (0.2, 1.0),
    "allreduce_latency_s": (1e-6, 50e-6),
    "request_cpu_s": (1e-3, 0.3),
}


class FixedStepTime:
    """Every forward step takes the same time (a unit clock for reasoning in steps)."""

    request_cpu_s = 0.0

    def __init__(self, seconds: float = 0.01):
        if seconds <= 0:
            raise ValueError(f"step time must be > 0 s, got {seconds}")
        self.seconds = seconds

    def __call__(self, batch) -> float:
        return self.seconds

    def describe(self) -> str:
        return f"fixed {self.seconds * 1e3:g} ms per step"


@dataclass(frozen=True)
class Coefficients:
    hbm_efficiency_sm80: float = DEFAULTS["hbm_efficiency_sm80"]
    hbm_efficiency_sm89: float = DEFAULTS["hbm_efficiency_sm89"]
    hbm_efficiency_sm90: float = DEFAULTS["hbm_efficiency_sm90"]
    hbm_efficiency_sm100: float = DEFAULTS["hbm_efficiency_sm100"]
    hbm_efficiency_gfx942: float = DEFAULTS["hbm_efficiency_gfx942"]
    mfu_sm80: float = DEFAULTS["mfu_sm80"]
    mfu_sm89: float = DEFAULTS["mfu_sm89"]
    mfu_sm90: float = DEFAULTS["mfu_sm90"]
    mfu_sm100: float = DEFAULTS["mfu_sm100"]
    mfu_gfx942: float = DEFAULTS["mfu_gfx942"]
    moe_gemm_efficiency: float = DEFAULTS["moe_gemm_efficiency"]
    graph_layer_s_sm80: float = DEFAULTS["graph_layer_s_sm80"]
    graph_layer_s_sm89: float = DEFAULTS["graph_layer_s_sm89"]
    graph_layer_s_sm90: float = DEFAULTS["graph_layer_s_sm90"]
    graph_layer_s_sm100: float = DEFAULTS["graph_layer_s_sm100"]
    graph_layer_s_gfx942: float = DEFAULTS["graph_layer_s_gfx942"]
    eager_layer_s_sm80: float = DEFAULTS["eager_layer_s_sm80"]
    eager_layer_s_sm89: float = DEFAULTS["eager_layer_s_sm89"]
    eager_layer_s_sm90: float = DEFAULTS["eager_layer_s_sm90"]
    eager_layer_s_sm100: float = DEFAULTS["eager_layer_s_sm100"]
    eager_layer_s_gfx942: float = DEFAULTS["eager_layer_s_gfx942"]
    fp8_layer_s_sm80: float = DEFAULTS["fp8_layer_s_sm80"]
    fp8_layer_s_sm89: float = DEFAULTS["fp8_layer_s_sm89"]
    fp8_layer_s_sm90: float = DEFAULTS["fp8_layer_s_sm90"]
    fp8_layer_s_sm100: float = DEFAULTS["fp8_layer_s_sm100"]
    fp8_layer_s_gfx942: float = DEFAULTS["fp8_layer_s_gfx942"]
    step_overhead_s: float = DEFAULTS["step_overhead_s"]
    moe_token_layer_s: float = DEFAULTS["moe_token_layer_s"]
    linear_prefill_token_layer_s: float = DEFAULTS["linear_prefill_token_layer_s"]
    triton_decode_token_layer_s: float = DEFAULTS["triton_decode_token_layer_s"]
    triton_decode_kv_token_layer_s: float = DEFAULTS["triton_decode_kv_token_layer_s"]
    link_efficiency: float = DEFAULTS["link_efficiency"]
    allreduce_latency_s: float = DEFAULTS["allreduce_latency_s"]
    request_cpu_s: float = DEFAULTS["request_cpu_s"]

    def hbm_efficiency(self, arch: str) -> float:
        return getattr(self, f"hbm_efficiency_{arch}")

    def mfu(self, arch: str) -> float:
        return getattr(self, f"mfu_{arch}")

    def layer_s(self, arch: str, graph: bool) -> float:
        return getattr(self, f"{'graph' if graph else 'eager'}_layer_s_{arch}")

    @staticmethod
    def names() -> list[str]:
        return [f.name for f in fields(Coefficients)]

    @staticmethod
    def from_calibration(path: str | Path) -> "Coefficients":
        """Read ``{"device": ..., "date": ..., "coefficients": {name: value}}``; unknown names are errors."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not a poolsim calibration file ({e})") from None
        if isinstance(data, dict) and "coefficients" not in data and "phase" in data:
            # `poolsim calibrate` stopped (killed, out of memory) before its fit wrote any coefficient
            raise ValueError(f"{path}: a calibration that stopped at its {data['phase']!r} phase, before the fit: "
                             "no coefficients (run calibrate again)")
        try:
            coeffs = data["coefficients"]
            unknown = set(coeffs) - set(Coefficients.names())
        except (KeyError, TypeError) as e:
            raise ValueError(f"{path}: not a poolsim calibration file ({e})") from None
        if unknown:
            raise ValueError(f"{path}: unknown coefficient(s) {', '.join(sorted(unknown))}")
        bad = [k for k, v in coeffs.items() if isinstance(v, bool) or not isinstance(v, (int, float))
               or not math.isfinite(v) or v <= 0]
        if bad:
            raise ValueError(f"{path}: coefficient(s) {', '.join(bad)} must be finite positive numbers")
        # physical ranges, wider than FIT_BOUNDS (a GPU may measure outside what the fit allows): an efficiency is a
        # fraction of a datasheet peak; every other coefficient is seconds per step, layer or token
        over = [k for k, v in coeffs.items() if v > 1]
        if over:
            k = over[0]
            what = "a fraction of the datasheet peak, at most 1" if _is_efficiency(k) else "seconds, under 1"
            raise ValueError(f"{path}: coefficient {k} = {coeffs[k]:g}: must be {what}")
        return replace(Coefficients(), **{k: float(v) for k, v in coeffs.items()})


def _is_efficiency(name: str) -> bool:
    return name.startswith(("hbm_efficiency_", "mfu_")) or name in ("moe_gemm_efficiency", "link_efficiency")


def prior_only_note(arch: str | None) -> str:
    """``""`` when the fitted defaults moved some coefficient of ``arch``; otherwise a clause saying its terms are
    still the priors (no published run on that architecture was fitted), so the quoted error is not its own."""
    names = [n for n in DEFAULTS if arch and n.endswith(f"_{arch}")]
    if not names or any(DEFAULTS[n] != PRIORS.get(n) for n in names):
        return ""
    return f"; the {arch} terms are priors: no published run on {arch} was fitted (a calibration file replaces them)"


def calibration_source(path: str | Path, arch: str | None = None) -> str:
    """How ``run`` names a calibration file: its path, and the device and date it was measured on. A file that
    ``poolsim calibrate`` fitted on another GPU architecture than the run's (``arch``) moved none of this run's
    per-architecture coefficients, so its own error does not apply: the line says so and quotes the defaults'."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return f"calibration {path}"
    if not isinstance(data, dict):
        return f"calibration {path}"
    device = data.get("device")
    if isinstance(device, dict):  # `poolsim calibrate` records the device's details: name it by model and torch id
        device = " ".join(str(device[k]) for k in ("name", "device") if device.get(k) and device[k] != "cpu") \
            or device.get("device")
    what = ", ".join(str(v) for v in (device, data.get("date")) if v)
    error = data.get("measured_error")  # what the calibration run measured, if it says
    fit = data.get("fit")
    fitted_arch = fit.get("arch") if isinstance(fit, dict) else None
    if arch and fitted_arch and fitted_arch != arch:
        error = (f"fitted on {fitted_arch}: this {arch} GPU keeps the fitted defaults of its architecture "
                 f"({MEASURED_ERROR})")
    return (f"calibration {path}" + (f" ({what})" if what else "")
            + (f"; {error}" if error else "; its error against published runs: not measured"))


@dataclass(frozen=True)
class ModelCost:
    """What one step costs, per tp rank, in the units the roofline needs."""

    dense_weight_bytes: float  # read every step
    expert_weight_bytes: float  # all routed experts of all layers
    num_experts: int  # routed experts per layer (0: dense model)
    top_k: int
    active_params: float  # multiplied through per token, per rank (routed experts: top_k of them)
    kv_cell_bytes: float  # KV bytes per token over the full-attention layers, per rank
    prefill_pair_flops: float  # attention flops per (query, key) pair over all full-attention layers, per rank
    decode_pair_flops: float
    linear_token_flops: float  # recurrent-state flops per token over all linear layers, per rank
    state_bytes: float  # one request's recurrent state (conv + SSM) per rank
    hidden_size: int
    num_layers: int
    tp: int
    peak_flops: float
    hbm_bandwidth: float
    expert_active_params: float = 0.0  # routed-expert part of active_params (MoE grouped GEMM)
    num_moe_layers: int = 0
    num_linear_layers: int = 0
    ep: int = 1
    arch: str = "sm90"
    link_bandwidth: float = 450e9  # B/s per direction (GPU catalog)
    cuda_graph_max_bs: int = 0  # decode batches up to this replay a CUDA graph (0: graphs off)
    prefill_cuda_graph: bool = False  # prefill runs in a (breakable) CUDA graph
    fp8: bool = False  # FP8 linear layers (block-quantized checkpoint): activation quantization per GEMM
    num_full_attention_layers: int = 0
    triton_decode: bool = False  # decode attention runs SGLang's Triton split-KV kernel

    @staticmethod
    def from_model(model, gpu, plan, args=None) -> "ModelCost":
        """``args`` (ServerArgs, optional) says whether CUDA graphs are on and the EP size; without it
        SGLang's defaults apply."""
        from poolsim.pools.sizing.server_defaults import decode_cuda_graph_max_bs, prefill_cuda_graph_on

        tp = plan.tp_size
        total = model.weight_bytes_per_rank(tp)
        expert = expert_active = 0.0
        for t in model.weight_tensors():
            if t.active < 1.0 and not t.runtime_copy:
                out, inp = t.shape_per_rank(tp)
                expert += out * inp * t.count * model.weight_bytes_per_param
                expert_active += t.numel * t.active / tp
        full_layers = len(model.full_attention_layer_ids)
        heads = max(1, model.num_attention_heads // tp)
        if model.use_mla:
            qk = model.qk_nope_head_dim + model.qk_rope_head_dim
            prefill_pair = 2 * heads * (qk + model.v_head_dim) * full_layers
            decode_pair = 2 * heads * (2 * model.kv_lora_rank + model.qk_rope_head_dim) * full_layers
        else:
            prefill_pair = decode_pair = 2 * heads * (model.head_dim + model.v_head_dim) * full_layers
        linear = 0.0
        num_linear = len(model.linear_layer_ids) if model.linear_attn is not None else 0
        if model.linear_attn is not None:
            la = model.linear_attn
            lin_heads = max(1, la.num_heads // tp)
            linear = 6 * lin_heads * la.head_k_dim * la.head_dim * num_linear
        quant_fp8 = model.quant_method == "fp8"
        layers = getattr(model, "layers", ()) or ()
        num_moe = sum(1 for spec in layers if getattr(spec, "mlp", None) == "moe")
        if model.moe and not num_moe:
            num_moe = model.num_hidden_layers
        graphs_off = bool(args is not None and args.disable_cuda_graph)
        max_bs = 0 if graphs_off else decode_cuda_graph_max_bs(
            gpu, tp, getattr(args, "max_running_requests", None))
        prefill_graph = (not graphs_off) and args is not None and prefill_cuda_graph_on(model, gpu, args)
        return ModelCost(
            dense_weight_bytes=total - expert,
            expert_weight_bytes=expert,
            num_experts=model.moe.num_experts if model.moe else 0,
            top_k=model.moe.top_k if model.moe else 0,
            active_params=model.active_param_count() / tp,
            kv_cell_bytes=plan.cell_size_bytes,
            prefill_pair_flops=prefill_pair,
            decode_pair_flops=decode_pair,
            linear_token_flops=linear,
            state_bytes=plan.mamba_bytes_per_slot or 0,
            hidden_size=model.hidden_size,
            num_layers=model.num_hidden_layers,
            tp=tp,
            peak_flops=gpu.fp8_flops if quant_fp8 else gpu.bf16_flops,
            hbm_bandwidth=gpu.hbm_bandwidth,
            expert_active_params=expert_active,
            num_moe_layers=num_moe,
            num_linear_layers=num_linear,
            ep=max(1, int(getattr(args, "ep_size", 1) or 1)),
            arch=gpu.arch,
            link_bandwidth=getattr(gpu, "link_bandwidth", 450e9),
            cuda_graph_max_bs=max_bs,
            prefill_cuda_graph=prefill_graph,
            fp8=quant_fp8,
            num_full_attention_layers=full_layers,
            triton_decode=getattr(plan, "attention_backend", None) == "triton",
        )


@dataclass(frozen=True)
class SpecCost:
    """What a speculative decode step runs besides the target (``AnalyticStepTime`` prices it)."""

    draft: ModelCost  # the draft model's cost per pass (its own weights, layers and KV cell)
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int

    @staticmethod
    def from_plan(draft_model, gpu, plan, args=None) -> "SpecCost":
        """The draft's ModelCost from ``plan.speculative``: its KV cell, the target's CUDA-graph limits, and its
        weights less the embedding (a lookup of a few rows, not a stream of the table)."""
        from types import SimpleNamespace

        sp = plan.speculative
        shim = SimpleNamespace(tp_size=plan.tp_size, cell_size_bytes=sp.draft_cell_bytes, mamba_bytes_per_slot=0,
                               attention_backend=plan.attention_backend)
        cost = ModelCost.from_model(draft_model, gpu, shim, args)
        embed = 0.0
        for t in draft_model.weight_tensors():
            if t.name == "embed_tokens":
                out, inp = t.shape_per_rank(plan.tp_size)
                embed += out * inp * t.count * (t.dtype_bytes or 2)
        cost = replace(cost, dense_weight_bytes=max(cost.dense_weight_bytes - embed, 0.0),
                       num_layers=max(1, sp.draft_pool_layers))
        return SpecCost(draft=cost, num_steps=sp.num_steps, eagle_topk=sp.eagle_topk,
                        num_draft_tokens=sp.num_draft_tokens)


class AnalyticStepTime:
    def __init__(self, cost: ModelCost, coefficients: Coefficients | None = None, source: str = "defaults",
                 spec: SpecCost | None = None):
        self.cost = cost
        self.k = coefficients or Coefficients()
        self.source = source
        self.spec = spec
        # speculative decode steps: seconds in all, and in the draft's passes and the target's verify
        self.spec_decode_s = self.spec_draft_s = self.spec_verify_s = 0.0

    @property
    def request_cpu_s(self) -> float:
        return self.k.request_cpu_s

    def describe(self) -> str:
        k, arch = self.k, self.cost.arch
        graph, eager = k.layer_s(arch, True) * 1e6, k.layer_s(arch, False) * 1e6
        return (f"analytic roofline ({self.source}): {arch} MFU {k.mfu(arch):g}, HBM efficiency "
                f"{k.hbm_efficiency(arch):g}, {graph:g}/{eager:g} us per layer (graph/eager), "
                f"{k.step_overhead_s * 1e3:g} ms per step, "
                f"{k.request_cpu_s * 1e3:g} ms CPU per request")

    def __call__(self, batch) -> float:
        prefill_tokens = decode_tokens = 0
        pairs_prefill = pairs_decode = context_tokens = 0
        for p, e in zip(batch.prefix_lens, batch.extend_lens):
            prefill_tokens += e
            pairs_prefill += e * p + e * (e + 1) // 2
            context_tokens += p + e
        if self.spec is not None:
            return self.spec_time_of(batch.forward_mode, prefill_tokens, pairs_prefill, context_tokens,
                                     batch.num_decode_reqs, batch.decode_seq_lens_sum, len(batch.reqs))
        if batch.forward_mode != "extend":
            decode_tokens = batch.num_decode_reqs
            pairs_decode = batch.decode_seq_lens_sum
            context_tokens += pairs_decode
        return self.time_of(prefill_tokens, decode_tokens, pairs_prefill, pairs_decode, context_tokens,
                            len(batch.reqs))

    def spec_time_of(self, forward_mode: str, prefill_tokens: int, pairs_prefill: int, context_tokens: int,
                     num_decode_reqs: int, seq_lens_sum: int, num_reqs: int) -> float:
        """A step with speculative decoding (module docstring): a prefill is the target's extend plus the draft's;
        a decode step is the verify, the draft's decode passes and its extend. ``seq_lens_sum``: the decode
        requests' committed KV."""
        sp, k = self.spec, self.k
        assert sp is not None
        if forward_mode == "extend":
            target = self.forward_s(self.cost, prefill_tokens, 0, pairs_prefill, 0, context_tokens, num_reqs)
            draft = self.forward_s(sp.draft, prefill_tokens, 0, pairs_prefill, 0, context_tokens, num_reqs)
            return target + draft + k.step_overhead_s
        bs, d, topk = num_decode_reqs, sp.num_draft_tokens, sp.eagle_topk
        tree_pairs = bs * d * (d + 1) // 2  # each verified token sees the tokens above it in its branch
        graph = 0 < bs <= self.cost.cuda_graph_max_bs
        verify = self.forward_s(self.cost, 0, bs * d, 0, d * seq_lens_sum + tree_pairs, seq_lens_sum, bs, graph)
        draft = 0.0
        for i in range(1, sp.num_steps):  # draft decode: topk candidates per request at depth i
            draft += self.forward_s(sp.draft, 0, bs * topk, 0, topk * (seq_lens_sum + bs * i), seq_lens_sum, bs,
                                    graph)
        draft += self.forward_s(sp.draft, 0, bs * d, 0, d * seq_lens_sum + tree_pairs, seq_lens_sum, bs, graph)
        total = verify + draft + k.step_overhead_s
        self.spec_decode_s += total
        self.spec_draft_s += draft
        self.spec_verify_s += verify
        return total

    def spec_stats(self) -> dict | None:
        """Seconds of speculative decode steps, and the share the draft's passes took (None: no speculation)."""
        if self.spec is None:
            return None
        return {"decode_s": self.spec_decode_s, "draft_s": self.spec_draft_s, "verify_s": self.spec_verify_s,
                "draft_overhead": self.spec_draft_s / self.spec_decode_s if self.spec_decode_s else 0.0}

    def uses_graph(self, prefill_tokens: int, num_reqs: int) -> bool:
        """Decode steps up to cuda_graph_max_bs replay a captured graph; prefill steps only where
        SGLang captures prefill graphs (breakable graphs, up to the chunked prefill size)."""
        c = self.cost
        if prefill_tokens:
            return c.prefill_cuda_graph
        return 0 < num_reqs <= c.cuda_graph_max_bs

    def time_of(self, prefill_tokens: int, decode_tokens: int, pairs_prefill: int, pairs_decode: int,
                context_tokens: int, num_reqs: int) -> float:
        return self.forward_s(self.cost, prefill_tokens, decode_tokens, pairs_prefill, pairs_decode, context_tokens,
                              num_reqs) + self.k.step_overhead_s

    def forward_s(self, c: ModelCost, prefill_tokens: int, decode_tokens: int, pairs_prefill: int, pairs_decode: int,
                  context_tokens: int, num_reqs: int, graph: bool | None = None) -> float:
        """One forward pass of the model ``c`` describes, without the per-step overhead; ``graph``: whether it
        replays a CUDA graph (None: decode batches up to cuda_graph_max_bs, prefill where prefill graphs are on)."""
        k = self.k
        tokens = prefill_tokens + decode_tokens
        mfu = k.mfu(c.arch)
        dense_flops = (2 * (c.active_params - c.expert_active_params) * tokens
                       + c.prefill_pair_flops * pairs_prefill + c.decode_pair_flops * pairs_decode
                       + c.linear_token_flops * tokens)
        compute = (dense_flops / (c.peak_flops * mfu)
                   + 2 * c.expert_active_params * tokens / (c.peak_flops * mfu * k.moe_gemm_efficiency))
        touched = 1.0
        if c.num_experts:
            touched = 1 - (1 - c.top_k / c.num_experts) ** tokens  # expected share of experts any token picks
        nbytes = (c.dense_weight_bytes + c.expert_weight_bytes * touched
                  + c.kv_cell_bytes * (context_tokens + tokens) + 2 * c.state_bytes * num_reqs)
        memory = nbytes / (c.hbm_bandwidth * k.hbm_efficiency(c.arch))
        if graph is None:
            graph = c.prefill_cuda_graph if prefill_tokens else 0 < num_reqs <= c.cuda_graph_max_bs
        launch = c.num_layers * k.layer_s(c.arch, graph)
        if c.fp8:
            launch += c.num_layers * getattr(k, f"fp8_layer_s_{c.arch}")
        link = c.link_bandwidth * k.link_efficiency
        moe = c.num_moe_layers * tokens * k.moe_token_layer_s
        if c.ep > 1 and c.num_moe_layers:
            a2a_bytes = tokens * c.top_k * c.hidden_size * 2 * (c.ep - 1) / c.ep
            moe += 2 * c.num_moe_layers * a2a_bytes / link  # dispatch + combine
        linear = c.num_linear_layers * prefill_tokens * k.linear_prefill_token_layer_s
        triton = 0.0
        if c.triton_decode and decode_tokens:
            triton = c.num_full_attention_layers * (pairs_decode / decode_tokens * k.triton_decode_token_layer_s
                                                    + pairs_decode * k.triton_decode_kv_token_layer_s)
        comm = 0.0
        if c.tp > 1:
            msg = tokens * c.hidden_size * 2
            per_allreduce = 2 * (c.tp - 1) / c.tp * msg / link + k.allreduce_latency_s
            comm = 2 * c.num_layers * per_allreduce
        return max(compute, memory) + triton + launch + moe + linear + comm


# HiCache's device<->host copies (pools/mem_cache/hiradix_cache.py). Their bandwidth is the GPU catalog's host link
# per direction times this efficiency: the share of a PCIe link's datasheet rate that large pinned-memory DMA copies
# reach (PCIe Gen5 x16: ~50-55 of 64 GB/s; Gen4: ~25 of 32). A named constant, not fitted: no published SGLang
# run with HiCache is in bench/data, and a calibration file does not set it.
HOST_LINK_EFFICIENCY = 0.8


class HiCacheStepTime:
    """A step-time model with HiCache's transfers on top of ``base``'s forward time.

    Load-back: SGLang's cache controller copies a batch's host hits layer by layer on its own stream
    (``start_loading``, ``managers/cache_controller.py:1028-1069``) and the forward pass waits at each layer for
    that layer's copy (``LayerDoneCounter.wait_until``, ``:102-105``). With ``L`` layers, a forward of ``c`` seconds
    and a copy of ``h`` seconds (``bytes / (host link x HOST_LINK_EFFICIENCY)``), the pipeline takes
    ``max(c + h / L, h + c / L)``: the first layer's copy before any compute when compute dominates, the last
    layer's compute after every copy when the copy dominates. Exact: the layer-wise ordering; modelled: equal
    layers, one copy stream at a constant rate, no contention with the D->H writes.

    Write-back (``--hicache-write-policy write_back``): eviction copies the victim to host and waits for it
    (``writing_check(write_back=True)``), on the scheduler's thread: that time is added to the step it was
    scheduling. Write-through copies run beside the forward passes and cost none of their time (their
    completion only decides when a node's lock is released)."""

    def __init__(self, base, num_layers: int):
        self.base = base
        self.num_layers = max(1, num_layers)
        self.request_cpu_s = float(getattr(base, "request_cpu_s", 0.0))

    def __call__(self, batch) -> float:
        t = self.base(batch)
        tree = batch.tree_cache
        ctrl = getattr(tree, "hicache", None)
        if ctrl is None:
            return t
        loaded, stall = ctrl.pop_step_io()
        if loaded:
            h = ctrl.transfer_s(loaded)
            t = max(t + h / self.num_layers, h + t / self.num_layers)
        return t + stall

    def describe(self) -> str:
        return (f"{self.base.describe()}; HiCache copies over the host link at {HOST_LINK_EFFICIENCY:g} of its "
                f"datasheet rate, load-back overlapped layer by layer")
