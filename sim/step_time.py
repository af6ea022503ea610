"""Step-time models: map a scheduled batch to the seconds its forward pass takes on one tp group.

``AnalyticStepTime`` is a roofline per step, on one tp rank (all ranks run the same shapes):

    t = max(flops / (peak_flops x MFU), bytes / (hbm_bandwidth x BW_EFFICIENCY)) + comm + OVERHEAD_S

    flops = 2 x active_params/tp x tokens                        GEMMs (MoE: top-k experts per token)
          + attention pairs x flops_per_pair                      causal prefill: e x p + e(e+1)/2 per request;
                                                                  decode: seq_len per request
          + linear-attention tokens x 6 x H/tp x K x V x L_lin    KDA/GDN state update per token
    bytes = dense weights + routed-expert weights x (experts touched / experts)   weights read once per step
          + context tokens x KV cell bytes                        attention reads each request's KV once
          + new tokens x KV cell bytes                            KV writes
          + 2 x state bytes per request slot                      recurrent state read + write
    comm  = 2 all-reduces per layer of tokens x hidden x 2 B: 2 (tp-1)/tp x bytes / LINK_BANDWIDTH + latency

The efficiency constants below are defaults from public measurements of the same class of kernels;
a calibration file measured on the GPU (``--calibration FILE``, JSON written by the GPU calibration
mode) replaces them. The same batch always gives the same time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

MFU = 0.55  # achieved / peak dense FLOP/s in large prefill GEMMs and flash attention
BW_EFFICIENCY = 0.75  # achieved / spec HBM bandwidth when streaming weights and KV in decode
OVERHEAD_S = 0.0015  # per step: kernel launches (CUDA graph replay), sampling, scheduler work not overlapped
LINK_BANDWIDTH = 450e9  # B/s per direction; NVLink 4 (H100/H200 NVSwitch): 900 GB/s bidirectional
ALLREDUCE_LATENCY_S = 8e-6  # one small all-reduce with SGLang's custom all-reduce kernel


class FixedStepTime:
    """Every forward step takes the same time (a unit clock for reasoning in steps)."""

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
    mfu: float = MFU
    bw_efficiency: float = BW_EFFICIENCY
    overhead_s: float = OVERHEAD_S
    link_bandwidth: float = LINK_BANDWIDTH
    allreduce_latency_s: float = ALLREDUCE_LATENCY_S

    @staticmethod
    def from_calibration(path: str | Path) -> "Coefficients":
        """Read ``{"device": ..., "date": ..., "coefficients": {name: value}}``; unknown names are errors."""
        try:
            data = json.loads(Path(path).read_text())
            coeffs = data["coefficients"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: not a poolsim calibration file ({e})") from None
        base = Coefficients()
        unknown = set(coeffs) - set(base.__dataclass_fields__)
        if unknown:
            raise ValueError(f"{path}: unknown coefficient(s) {', '.join(sorted(unknown))}")
        bad = [k for k, v in coeffs.items() if not isinstance(v, (int, float)) or v <= 0]
        if bad:
            raise ValueError(f"{path}: coefficient(s) {', '.join(bad)} must be positive numbers")
        return replace(base, **{k: float(v) for k, v in coeffs.items()})


@dataclass(frozen=True)
class ModelCost:
    """What one step costs, per tp rank, in the units the roofline needs."""

    dense_weight_bytes: float  # read every step
    expert_weight_bytes: float  # all routed experts of all layers
    num_experts: int  # routed experts per layer (0: dense model)
    top_k: int
    active_params: float  # multiplied through per token, per rank
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

    @staticmethod
    def from_model(model, gpu, plan) -> "ModelCost":
        tp = plan.tp_size
        total = model.weight_bytes_per_rank(tp)
        expert = 0.0
        for t in model.weight_tensors():
            if t.active < 1.0 and not t.runtime_copy:
                out, inp = t.shape_per_rank(tp)
                expert += out * inp * t.count * model.weight_bytes_per_param
        full_layers = len(model.full_attention_layer_ids)
        heads = max(1, model.num_attention_heads // tp)
        if model.use_mla:
            qk = model.qk_nope_head_dim + model.qk_rope_head_dim
            prefill_pair = 2 * heads * (qk + model.v_head_dim) * full_layers
            decode_pair = 2 * heads * (2 * model.kv_lora_rank + model.qk_rope_head_dim) * full_layers
        else:
            prefill_pair = decode_pair = 2 * heads * (model.head_dim + model.v_head_dim) * full_layers
        linear = 0.0
        if model.linear_attn is not None:
            la = model.linear_attn
            lin_heads = max(1, la.num_heads // tp)
            linear = 6 * lin_heads * la.head_k_dim * la.head_dim * len(model.linear_layer_ids)
        quant_fp8 = model.quant_method == "fp8"
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
        )


class AnalyticStepTime:
    def __init__(self, cost: ModelCost, coefficients: Coefficients | None = None, source: str = "defaults"):
        self.cost = cost
        self.k = coefficients or Coefficients()
        self.source = source

    def describe(self) -> str:
        k = self.k
        return (f"analytic roofline ({self.source}): MFU {k.mfu:g}, HBM efficiency {k.bw_efficiency:g}, "
                f"overhead {k.overhead_s * 1e3:g} ms/step")

    def __call__(self, batch) -> float:
        prefill_tokens = decode_tokens = 0
        pairs_prefill = pairs_decode = context_tokens = 0
        for p, e in zip(batch.prefix_lens, batch.extend_lens):
            prefill_tokens += e
            pairs_prefill += e * p + e * (e + 1) // 2
            context_tokens += p + e
        if batch.forward_mode != "extend":
            for s in batch.decode_seq_lens:
                decode_tokens += 1
                pairs_decode += s
                context_tokens += s
        return self.time_of(prefill_tokens, decode_tokens, pairs_prefill, pairs_decode, context_tokens,
                            len(batch.reqs))

    def time_of(self, prefill_tokens: int, decode_tokens: int, pairs_prefill: int, pairs_decode: int,
                context_tokens: int, num_reqs: int) -> float:
        c, k = self.cost, self.k
        tokens = prefill_tokens + decode_tokens
        flops = (2 * c.active_params * tokens + c.prefill_pair_flops * pairs_prefill
                 + c.decode_pair_flops * pairs_decode + c.linear_token_flops * tokens)
        touched = 1.0
        if c.num_experts:
            touched = 1 - (1 - c.top_k / c.num_experts) ** tokens  # expected share of experts any token picks
        nbytes = (c.dense_weight_bytes + c.expert_weight_bytes * touched
                  + c.kv_cell_bytes * (context_tokens + tokens) + 2 * c.state_bytes * num_reqs)
        compute = flops / (c.peak_flops * k.mfu)
        memory = nbytes / (c.hbm_bandwidth * k.bw_efficiency)
        comm = 0.0
        if c.tp > 1:
            msg = tokens * c.hidden_size * 2
            per_allreduce = 2 * (c.tp - 1) / c.tp * msg / k.link_bandwidth + k.allreduce_latency_s
            comm = 2 * c.num_layers * per_allreduce
        return max(compute, memory) + comm + k.overhead_s
