"""How SGLang 0.5.23 lays a server's ranks out: tensor parallelism and attention data parallelism inside it.

``--attn-dp-size N`` (``arg_groups/fields/parallel.py:81-89``; the deprecated ``--dp-size N --enable-dp-attention``
resolves to it, ``server_args.py:319-332, 414-425``) splits the TP group of ``tp`` ranks into N attention-DP
groups of ``attn_tp = tp / N`` ranks (``attn_tp_size`` is derived, ``arg_groups/fields/parallel.py:317-323``). Each
group runs its own scheduler over its own requests, so its KV pool holds only its requests' KV; the FFN (dense
MLP, MoE) stays tensor parallel over all ``tp`` ranks. What this changes in sizing, each from the wheel:

- weights per rank: the attention projections and the input embedding shard over ``attn_tp``
  (``pools/model/config.py weight_group``); the rest over ``tp``; ``--moe-dense-tp-size 1`` replicates the
  dense MLP (``models/deepseek_v2.py:2665``; ``arg_groups/validation_hook.py:207-211``: None, 1 or tp);
- KV heads per rank: ``get_num_kv_heads(attn_tp)`` (``mem_cache/kv_cache_configurator.py:1047-1048``); an MLA
  latent is one head whatever the width, so it is the same cell, but each DP group's ranks hold other requests;
- ``max_running_requests`` is per DP worker: ``max(1, N_requested // attn_dp)``
  (``kv_cache_configurator.py:3119-3130``);
- ``chunked_prefill_size //= attn_dp`` after the memory defaults (``arg_groups/parallel_hook.py:326-336``) and
  ``schedule_conservativeness *= 0.3`` (``:316-322``);
- the graph reserve behind ``mem_fraction_static`` gains ``max_bs * attn_dp * 3`` MiB, and ``* 1.5`` more above
  a max_bs of 300 (``arg_groups/memory_hook.py:370-378``; ``server_defaults._reserve_for_graph_mib``).

``--ep-size E`` (``arg_groups/fields/parallel.py:281-288``): each rank holds num_experts / E routed experts
(``layers/moe/fused_moe_triton/layer.py:414-416``) with the expert intermediate split over moe_tp = tp / E
(``:427-428``, ``runtime_context.py:154``): the same bytes as TP up to padding and fp8 block-scale rounding.
DeepSeek's shared experts stay over tp (their fusion is off under EP on NVIDIA, ``models/deepseek_v2.py:3385-3391``,
and the unfused MLP uses the tp group, ``:888-896``). ``--moe-a2a-backend`` other than none is refused.

Checks SGLang makes: ``attn_dp >= 1`` and not with ``--dp-size`` > 1 (``parallel_hook.py:285-292``); tp divisible
by attn_dp (``:326``); the attention heads divisible by attn_tp (``models/deepseek_v2.py:2057``,
``models/qwen3.py:166-177``). A model class that shards attention over the whole tp group (``models/llama.py:181``,
``models/qwen2.py:165``) has no attention-DP layout; poolsim refuses those by architecture.
"""

from __future__ import annotations

from dataclasses import dataclass

from poolsim.pools.errors import SizingError
from poolsim.pools.model.config import ModelConfig

# Model classes whose attention shards over attn_tp (``parallel_group="attn_tp"``), as poolsim sizes them
ATTN_DP_ARCHS = {
    "DeepseekV2ForCausalLM": "models/deepseek_v2.py:2051-2161",
    "DeepseekV3ForCausalLM": "models/deepseek_v2.py:2051-2161",
    "Qwen3ForCausalLM": "models/qwen3.py:164-211",
}
# Families whose dense MLP honours --moe-dense-tp-size (DeepseekV2DecoderLayer)
DENSE_TP_ARCHS = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")


@dataclass(frozen=True)
class ParallelLayout:
    tp: int  # ranks in the TP group (SGLang's tp_size: the world size of one pipeline stage)
    attn_tp: int  # ranks one attention-DP group shards attention over: tp // attn_dp
    attn_dp: int  # attention-DP groups, one scheduler and one set of request pools each
    ep: int = 1
    pp: int = 1
    nnodes: int = 1
    dense_tp: int | None = None  # --moe-dense-tp-size (None: tp)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    def to_dict(self) -> dict:
        return dict(tp=self.tp, attn_tp=self.attn_tp, attn_dp=self.attn_dp, ep=self.ep, pp=self.pp,
                    nnodes=self.nnodes)


def resolve_layout(model: ModelConfig, args) -> ParallelLayout:
    """The layout SGLang builds for ``args``, with the checks it makes; refuses what poolsim cannot size."""
    tp, dp, attn_dp = args.tp_size, args.dp_size, args.attn_dp_size
    dense = args.moe_dense_tp_size
    if attn_dp < 1:
        raise SizingError(f"--attn-dp-size {attn_dp} must be positive")
    if attn_dp > 1 and dp > 1:  # parallel_hook.py:287-292
        raise SizingError(f"--dp-size {dp} with --attn-dp-size {attn_dp}: data-parallel replicas combined with "
                          "attention data parallelism are not supported")
    if tp % attn_dp:  # parallel_hook.py:326
        raise SizingError(f"--tp {tp} is not divisible by --attn-dp-size {attn_dp}")
    if dense is not None and dense not in (1, tp):  # validation_hook.py:207-211
        raise SizingError(f"--moe-dense-tp-size {dense}: only unset, 1 or --tp {tp} are supported")
    if attn_dp > 1 and model.architecture not in ATTN_DP_ARCHS:
        raise SizingError(f"--attn-dp-size {attn_dp}: poolsim sizes attention DP for "
                          f"{', '.join(sorted(ATTN_DP_ARCHS))} (their attention shards over the attention-TP "
                          f"group); not for {model.architecture}")
    if dense == 1 and tp > 1 and model.architecture not in DENSE_TP_ARCHS:
        raise SizingError(f"--moe-dense-tp-size 1: poolsim models it for {', '.join(DENSE_TP_ARCHS)} "
                          f"(models/deepseek_v2.py:2665); not for {model.architecture}")
    ep = args.ep_size
    if args.moe_a2a_backend != "none":
        raise SizingError(f"--moe-a2a-backend {args.moe_a2a_backend}: poolsim sizes only none; the all-to-all "
                          "backends allocate their own dispatch buffers, force --ep-size to --tp "
                          "(arg_groups/overrides.py:1611-1620) and replicate DeepSeek's shared experts "
                          "(models/deepseek_v2.py:874-896), none of which is modelled")
    if ep < 1:
        raise SizingError(f"--ep-size {ep} must be positive")
    if tp % ep:  # tp_size == moe_ep_size * moe_dp_size * moe_tp_size (runtime_context.py:137-154, :303-308)
        raise SizingError(f"--tp {tp} is not divisible by --ep-size {ep}")
    e = model.moe
    if ep > 1 and e is not None:
        if e.num_experts % ep:  # layers/moe/fused_moe_triton/layer.py:414
            raise SizingError(f"--ep-size {ep} does not divide the {e.num_experts} routed experts")
        if e.intermediate_size % (tp // ep):  # layer.py:427
            raise SizingError(f"moe_intermediate_size {e.intermediate_size} is not divisible by the MoE TP size "
                              f"{tp // ep} (--tp {tp} / --ep-size {ep})")
    if args.pp_size < 1:
        raise SizingError(f"--pp-size {args.pp_size} must be positive")
    check_pp(model, args)
    nn = args.nnodes
    if (tp * args.pp_size) % nn:  # arg_groups/validation_hook.py:179-181
        raise SizingError(f"--nnodes {nn} does not divide the --tp {tp} x --pp-size {args.pp_size} GPUs")
    if dp > 1 and nn > 1:  # validation_hook.py:199-202
        raise SizingError(f"--dp-size {dp} with --nnodes {nn}: multi-node data-parallel replicas are not supported; "
                          "use attention DP (--attn-dp-size) across nodes")
    return ParallelLayout(tp=tp, attn_tp=tp // attn_dp, attn_dp=attn_dp, ep=ep, pp=args.pp_size, nnodes=nn,
                          dense_tp=dense)


def check_nodes(layout: ParallelLayout, gpu) -> str | None:
    """The GPUs per node the layout needs against the system's (``GPUSpec.gpus_per_node``): an error past it on
    several nodes; on one node, the warning to return (a single-node launch of more GPUs than a node has)."""
    per_node = layout.gpus // layout.nnodes
    cap = gpu.gpus_per_node
    if cap is None:
        if layout.nnodes > 1:
            raise SizingError(f"--nnodes {layout.nnodes} on {gpu.name}: the catalog has no node size for it")
        return None
    if per_node <= cap:
        return None
    if layout.nnodes > 1:
        raise SizingError(f"--nnodes {layout.nnodes}: {layout.gpus} GPUs is {per_node} per node, more than the {cap} "
                          f"of a {gpu.name} node")
    return (f"tp {layout.tp} x pp {layout.pp} = {layout.gpus} GPUs exceed the {cap} of one {gpu.name} node: SGLang "
            f"needs --nnodes {-(-layout.gpus // cap)}")


def weight_bytes_per_rank(model: ModelConfig, layout: ParallelLayout, gpu_arch: str) -> int:
    """Bytes of weights on one rank of ``layout``."""
    if layout.attn_dp == 1 and layout.dense_tp in (None, layout.tp) and layout.ep == 1:
        return model.weight_bytes_per_rank(layout.tp, gpu_arch)
    return model.weight_bytes_per_rank(layout.tp, gpu_arch, attn_tp=layout.attn_tp, dense_tp=layout.dense_tp,
                                       ep=layout.ep)



# ---- pipeline parallelism --------------------------------------------------------------------------


def pp_layer_ranges(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """get_pp_indices (distributed/utils.py:110-150) without SGLANG_PP_LAYER_PARTITION: num_layers // pp each,
    the last num_layers % pp stages one more."""
    base, extra = divmod(num_layers, pp)
    out = []
    for rank in range(pp):
        if rank >= pp - extra:
            start = rank * (base + 1) - (pp - extra)
            out.append((start, start + base + 1))
        else:
            out.append((rank * base, rank * base + base))
    return out


@dataclass(frozen=True)
class PPStage:
    rank: int
    start_layer: int
    end_layer: int  # exclusive
    model: ModelConfig  # the stage's layers only (KV layer ids renumbered from 0)
    weight_bytes: int  # per rank of this stage


def check_pp(model: ModelConfig, args) -> None:
    """What poolsim sizes per stage: plain full-attention decoders (MHA, MLA), no draft model."""
    pp = args.pp_size
    if pp == 1:
        return
    n = len(model.layers)
    if pp > n:
        raise SizingError(f"--pp-size {pp}: more stages than the model's {n} layers")
    why = ("hybrid linear attention (the mamba pool's per-stage layer scale)" if model.is_hybrid
           else "sliding-window layers" if model.swa is not None
           else "DSA index caches" if model.dsa is not None
           else "multimodal towers" if model.is_multimodal
           else "family-specific tensors with no layer" if model.extra_weights else None)
    if why:
        raise SizingError(f"--pp-size {pp} on {model.name}: poolsim does not split {why} across stages")
    if getattr(args, "speculative_algorithm", None):
        raise SizingError(f"--pp-size {pp} with --speculative-algorithm: the draft's stage is not modelled")


def pp_stages(model: ModelConfig, layout: ParallelLayout, gpu_arch: str) -> list[PPStage]:
    """Each stage's layers and weights. The first stage holds the embedding, the last the LM head and final norm
    (PPMissingLayer elsewhere, models/deepseek_v2.py:2942-2949, :3285-3300; models/qwen2.py:369-372); a tied LM
    head becomes its own tensor on the last stage when pp > 1 (:3287)."""
    from dataclasses import replace

    stages = []
    ranges = pp_layer_ranges(len(model.layers), layout.pp)
    h = model.hidden_size
    untied = replace(model, tie_word_embeddings=False)
    for rank, (start, end) in enumerate(ranges):
        sub = replace(untied, layers=tuple(model.layers[start:end]), num_hidden_layers=end - start)
        first, last = rank == 0, rank == layout.pp - 1
        skip = tuple(name for name, held in (("embed_tokens", first), ("lm_head", last)) if not held)
        b = sub.weight_bytes_per_rank(layout.tp, gpu_arch, attn_tp=layout.attn_tp, dense_tp=layout.dense_tp,
                                      ep=layout.ep, skip=skip)
        if not last:  # the final norm (one h-wide vector in the model dtype) is the last stage's
            from poolsim.pools.dtypes import dtype_bytes

            b -= h * dtype_bytes(model.dtype)
        stages.append(PPStage(rank, start, end, sub, b))
    return stages
