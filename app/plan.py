"""A memory plan beside others: the model's all-full-attention twin and/or a second model (``plan --compare``,
and run.json's ``hybrid_compare``)."""

from __future__ import annotations

from poolsim.app.server import second_model_args
from poolsim.pools.hardware.gpu_catalog import GPUSpec
from poolsim.pools.model.config import ModelConfig
from poolsim.pools.sizing.plan import MemoryPlan, compare_records, crossover_context_len, plan_memory
from poolsim.pools.sizing.server_args import ServerArgs

PLAN_COMPARE_CONTEXT_LENS = [2**k for k in range(10, 21)]  # plan --compare: 1Ki to 1Mi tokens


def compare_plans(model: ModelConfig, gpu: GPUSpec, args: ServerArgs, plan: MemoryPlan, context_lens: list[int], *,
                  runtime_overhead_gib: float | None = None, against: str | None = None,
                  against_tp: int | None = None) -> dict:
    """``plan`` (``model``'s) beside its all-full-attention twin (hybrid and hybrid-SWA models) and the model
    ``against`` at ``against_tp``: ``records``, bytes per request and max concurrency at each context length
    (``compare_records``, labelled by model name); for linear-attention hybrids also where the fixed state stops
    costing more than the KV it replaces, with 1 slot per request and with the slots SGLang reserves."""
    plans = {model.name: plan}
    if model.is_hybrid or model.is_hybrid_swa:
        twin = model.with_full_attention()
        plans[twin.name] = plan_memory(twin, gpu, args, runtime_overhead_gib=runtime_overhead_gib)
    elif against is None:
        raise ValueError(f"--compare: {model.name} has no linear-attention or SWA-pool layers; "
                         "name a second model with --against")
    if against is not None:
        other = ModelConfig.load(against, "--against")
        other_args = second_model_args(args, against_tp)
        try:
            plans[f"{other.name} (tp {other_args.tp_size})"] = plan_memory(other, gpu, other_args,
                                                                         runtime_overhead_gib=runtime_overhead_gib)
        except ValueError as e:
            raise ValueError(f"--against {against}: {e}") from None
    out = {"records": compare_records(plans, context_lens)}
    if model.is_hybrid:
        out["crossover_context_len"] = crossover_context_len(model, args)
        out["crossover_context_len_reserved_slots"] = crossover_context_len(model, args, slots=plan.mamba_ratio)
    return out
