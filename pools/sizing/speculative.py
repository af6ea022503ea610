"""Speculative decoding as SGLang 0.5.23 resolves and sizes it: the flags, the draft model, and what the draft takes
out of the target's KV budget.

Resolution (``arg_groups/speculative_hook.py``):

- ``NEXTN`` is an alias of ``EAGLE`` (``_resolve_speculative_algorithm_alias``, :109-116; ``spec_registry.py:183``).
  ``EAGLE``, ``EAGLE3`` and ``STANDALONE`` run the EAGLE v2 worker (``speculative/eagle_worker_v2.py``; 0.5.23 has no
  other EAGLE worker); the other builtins (``NGRAM``, ``DFLASH``, ``DSPARK``, ``UNO``, ``FROZEN_KV_MTP``) are
  refused by name.
- Without ``--max-running-requests`` the EAGLE family caps it at 48 (``_handle_eagle_family``, :1086-1094). This
  runs after the GPU-memory defaults (``arg_groups/pipeline.py:216-218`` before ``:304-306``), so
  ``mem_fraction_static`` and the decode CUDA-graph ``max_bs`` are those of the flags as given.
- Unset ``--speculative-num-steps`` picks (steps, topk, draft tokens) by architecture
  (``_auto_choose_speculative_params``, :1430-1461; topk and draft tokens must then be unset too, :1159-1163);
  with topk 1 the draft tokens become ``steps + 1`` (:1255-1266).
- A DeepSeek-V3-family target without ``--speculative-draft-model-path`` drafts with its own checkpoint
  (:1120-1143); loaded as a draft (``ModelConfig._config_draft_model``, configs/model_config.py:1010-1203) it is the
  NextN head: ``num_nextn_predict_layers`` layers of the target's attention and MLP.

Sizing (``model_executor/pool_configurator.py:255-314``, ``model_runner_components/spec_aux_hidden_state.py:132-196``):
the draft's KV pool holds as many tokens as the target's (the two share one slot index space: the draft worker
gets the target's ``memory_pool_config``, allocator and ``req_to_token`` pool, managers/scheduler.py:1097-1108),
and the target's cell size grows by layer-count scaling, ``int(cell x draft_layers / target_layers)``, which
assumes the draft has the target's per-layer KV size. ``draft_layers`` (``eagle_draft_num_layers``) is the draft's
``num_nextn_predict_layers``, else its layer count; a path-less draft on an architecture SGLang does not point at
the target's checkpoint reads the *target's* ``num_nextn_predict_layers``, and with none reserves nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from poolsim.pools.errors import SizingError
from poolsim.pools.model.config import LayerSpec, ModelConfig, WeightTensor

MODELLED_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")
# what else 0.5.23 accepts (spec_info.py:32-47), and why poolsim does not model it
REFUSED_ALGORITHMS = {
    "NGRAM": "drafts from an n-gram corpus on the host, no draft model (ngram_worker.py)",
    "DFLASH": "a block-diffusion draft sized from its own cell (draft_kv_budget.py, dflash_worker_v2.py)",
    "DSPARK": "ragged verification with a DSpark draft (dspark_components/)",
    "UNO": "a LoRA draft on the target itself with its own verify width (uno_worker_v2.py)",
    "FROZEN_KV_MTP": "Gemma-4 assistant drafts reading the target's KV (frozen_kv_mtp_worker_v2.py)",
}
SPEC_MAX_RUNNING_REQUESTS = 48  # speculative_hook.py:1086-1094
# architectures whose NEXTN/EAGLE draft defaults to the target checkpoint (speculative_hook.py:1120-1143)
MTP_TARGET_ARCHS = ("DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV4ForCausalLM", "Glm4MoeForCausalLM",
                    "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM", "BailingMoeForCausalLM",
                    "BailingMoeV2ForCausalLM", "BailingMoeV2_5ForCausalLM", "MistralLarge3ForCausalLM",
                    "PixtralForConditionalGeneration", "HYV3ForCausalLM", "HYV4ForCausalLM",
                    "Qwen4ExpForConditionalGeneration")
# loaded as a draft these keep the config's num_nextn_predict_layers (configs/model_config.py:1032-1070) ...
NEXTN_KEEP_ARCHS = ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "Glm4MoeForCausalLM",
                    "Glm4MoeLiteForCausalLM", "BailingMoeV2ForCausalLM", "BailingMoeForCausalLM",
                    "BailingMoeV2_5ForCausalLM")
# ... these get one NextN layer (configs/model_config.py:1057-1203)
NEXTN_ONE_ARCHS = ("DeepseekV4ForCausalLM", "Glm5NextForConditionalGeneration", "Qwen3NextForCausalLM",
                   "Qwen3MoeForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
                   "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM",
                   "NemotronHForCausalLM", "HYV3ForCausalLM", "HYV4ForCausalLM", "MiMoV2FlashForCausalLM")
# the architecture a checkpoint loads as when it drafts (configs/model_config.py:1032-1203)
DRAFT_ARCH_NAMES = {"DeepseekV3ForCausalLM": "DeepseekV3ForCausalLMNextN",
                    "DeepseekV32ForCausalLM": "DeepseekV3ForCausalLMNextN",
                    "Glm4MoeLiteForCausalLM": "Glm4MoeLiteForCausalLMNextN",
                    "Glm4MoeForCausalLM": "Glm4MoeForCausalLMNextN",
                    "Qwen3NextForCausalLM": "Qwen3NextForCausalLMMTP", "Qwen3MoeForCausalLM": "Qwen3MoeForCausalLMMTP",
                    "Qwen3_5ForConditionalGeneration": "Qwen3_5ForCausalLMMTP",
                    "Qwen3_5MoeForConditionalGeneration": "Qwen3_5ForCausalLMMTP",
                    "Qwen3_5ForCausalLM": "Qwen3_5ForCausalLMMTP", "Qwen3_5MoeForCausalLM": "Qwen3_5ForCausalLMMTP",
                    "NemotronHForCausalLM": "NemotronHForCausalLMMTP"}
# _auto_choose_speculative_params (speculative_hook.py:1430-1461): (num_steps, eagle_topk, num_draft_tokens)
AUTO_PARAMS_LLAMA = (5, 4, 8)
AUTO_PARAMS_DEFAULT = (3, 1, 4)
AUTO_PARAMS_5_4_8_ARCHS = ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM")
PAGE_TREE_BACKENDS = ("flashinfer", "fa3", "triton")  # topk > 1 at page > 1 (speculative_hook.py:1268-1282)
REQ_TO_TOKEN_EXTRA_CONTEXT = 4  # get_req_to_token_extra_context_len (allocation_sizing.py:96-116)


@dataclass(frozen=True)
class SpeculativeConfig:
    """The resolved speculative flags and the draft model, as the target sizes itself around it."""

    algorithm: str  # EAGLE | EAGLE3 | STANDALONE (NEXTN resolved to EAGLE)
    requested: str  # as given on the command line
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    auto_params: bool  # steps/topk/draft tokens chosen by _auto_choose_speculative_params
    draft: ModelConfig  # the draft model as the draft worker builds it
    draft_source: str  # where the draft came from
    budget_draft_layers: int  # eagle_draft_num_layers: what the target's cell size is scaled by (0: none)
    draft_pool_layers: int  # the layers of the draft worker's KV pool (_compute_model_num_layers)
    nextn: bool  # the draft is NextN/MTP layers of a checkpoint (num_nextn_predict_layers)
    accept_length: float | None = None
    accept_file: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def max_accept_length(self) -> int:
        """Tokens one verify step can commit: a draft chain of ``num_steps`` plus the bonus token."""
        return self.num_steps + 1

    def alloc_len_per_decode(self, page_size: int) -> int:
        """get_alloc_len_per_decode (allocation_sizing.py:28-61): KV one request may take in one decode step."""
        steps, topk, tokens = self.num_steps, self.eagle_topk, self.num_draft_tokens
        if page_size == 1 or topk == 1:
            return max(steps * topk, tokens)
        pages_per_topk = ((page_size - 1) + steps + page_size - 1) // page_size  # a branch's page-aligned footprint
        return max(pages_per_topk * page_size * topk, tokens)

    def alloc_reserve_per_decode(self, page_size: int) -> int:
        """get_alloc_reserve_per_decode (allocation_sizing.py:64-70): twice the step's length, the overlap
        loop's lag on kv_committed_len."""
        return 2 * self.alloc_len_per_decode(page_size)

    def req_to_token_extra_context(self, page_size: int) -> int:
        """get_req_to_token_extra_context_len (allocation_sizing.py:96-116): the row's headroom past the context."""
        extra = REQ_TO_TOKEN_EXTRA_CONTEXT + self.num_draft_tokens
        if page_size > 1:
            extra = max(extra, self.alloc_reserve_per_decode(page_size) + page_size - 1)
        return extra


def _arch(cfg: ModelConfig) -> str:
    return cfg.architecture


def _nextn_layers(hf: dict) -> int | None:
    value = hf.get("num_nextn_predict_layers")
    if value is None and isinstance(hf.get("text_config"), dict):
        value = hf["text_config"].get("num_nextn_predict_layers")
    return value


def draft_mode_nextn_layers(model: ModelConfig) -> int | None:
    """``num_nextn_predict_layers`` of ``model`` loaded as a draft (``_config_draft_model``): one for the
    architectures SGLang rewrites to a one-layer MTP head, the config's own value otherwise (None: not MTP)."""
    if model.architecture in NEXTN_ONE_ARCHS:
        return 1
    return _nextn_layers(model.hf_config)


def nextn_draft(target: ModelConfig, layers: int) -> ModelConfig:
    """The NextN/MTP draft built from a checkpoint: ``layers`` decoder layers of the target's attention and MLP
    (DeepseekModelNextN: a sparse layer, models/deepseek_nextn.py:58-140), its own ``embed_tokens`` and head, and
    the NextN projection ``eh_proj`` (2 x hidden -> hidden, an nn.Linear in the model dtype) with ``enorm``,
    ``hnorm`` and ``shared_head.norm``."""
    h = target.hidden_size
    arch = DRAFT_ARCH_NAMES.get(target.architecture, f"{target.architecture} (MTP)")
    W = WeightTensor
    extras = (W("nextn.eh_proj", h, 2 * h, layers, dtype_bytes=2),
              W("nextn.enorm_hnorm_shared_head_norm", h, 3, layers))
    if target.architecture in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM",
                               "Glm4MoeLiteForCausalLM"):
        # the same family parser over `layers` layers, every one sparse (is_nextn=True)
        hf = {**target.hf_config, "num_hidden_layers": layers, "first_k_dense_replace": 0, "moe_layer_freq": 1}
        draft = ModelConfig.from_dict(hf, source=target.source, name=f"{target.name} (NextN)")
        return replace(draft, architecture=arch, extra_weights=tuple(draft.extra_weights) + extras)
    mlp = "moe" if target.moe is not None else "dense"
    return replace(target, name=f"{target.name} (MTP)", architecture=arch,
                   layers=tuple(LayerSpec("attention", mlp) for _ in range(layers)),
                   num_hidden_layers=layers, linear_attn=None, mamba_ssm_dtype=None, swa=None, dsa=None,
                   extra_weights=extras, notes=())


def resolve_auto_params(algorithm: str, target_arch: str) -> tuple[int, int, int]:
    if algorithm == "STANDALONE":
        return AUTO_PARAMS_DEFAULT
    return AUTO_PARAMS_LLAMA if target_arch in AUTO_PARAMS_5_4_8_ARCHS else AUTO_PARAMS_DEFAULT


def speculative_flags_given(args) -> list[str]:
    names = ("speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
             "speculative_num_draft_tokens", "speculative_accept_length", "speculative_accept_file")
    return ["--" + n.replace("_", "-") for n in names if getattr(args, n, None) is not None]


def resolve_speculative(model: ModelConfig, args, load_model=ModelConfig.load) -> SpeculativeConfig | None:
    """The speculative configuration of ``args`` on ``model``, or None when speculation is off."""
    requested = args.speculative_algorithm
    if requested is None:
        given = speculative_flags_given(args)
        if given:
            raise SizingError(f"{given[0]} needs --speculative-algorithm (one of {', '.join(MODELLED_ALGORITHMS)})")
        return None
    name = str(requested).upper()
    if name in REFUSED_ALGORITHMS:
        raise SizingError(f"--speculative-algorithm {requested}: SGLang 0.5.23 accepts it, poolsim does not model it "
                          f"({REFUSED_ALGORITHMS[name]}); modelled: {', '.join(MODELLED_ALGORITHMS)}")
    if name not in MODELLED_ALGORITHMS:
        raise SizingError(f"--speculative-algorithm {requested!r}: unknown to SGLang 0.5.23 (spec_info.py:50-65); "
                          f"modelled: {', '.join(MODELLED_ALGORITHMS)}")
    algorithm = "EAGLE" if name == "NEXTN" else name
    notes: list[str] = []

    # ---- the draft model (spec_aux_hidden_state.py:132-196, layer_setup.py:201-230)
    path = args.speculative_draft_model_path
    if path is None and algorithm == "EAGLE" and model.architecture in MTP_TARGET_ARCHS:
        path_given, draft_base, source = True, model, f"{model.name}'s own NextN layers"
    elif path is None and algorithm == "EAGLE" and draft_mode_nextn_layers(model):
        # a path-less draft loads the target's checkpoint (ModelConfig.from_server_args: model_path or the target's)
        path_given, draft_base, source = False, model, f"{model.name}'s own MTP layers"
    elif path is None:
        raise SizingError(f"--speculative-algorithm {requested} on {model.architecture} needs "
                          "--speculative-draft-model-path (a config.json or catalog name): the model has no NextN "
                          "layers of its own")
    else:
        try:
            draft_base = load_model(path)
        except ValueError as e:  # the loader names --model; the user gave this flag
            raise SizingError(str(e).replace("--model ", "--speculative-draft-model-path ", 1)) from None
        path_given, source = True, str(path)
    nextn_layers = draft_mode_nextn_layers(draft_base)
    if nextn_layers is not None and nextn_layers <= 0:
        if draft_base is model or algorithm == "EAGLE" and draft_base.architecture in MTP_TARGET_ARCHS:
            raise SizingError(f"--speculative-algorithm {requested}: {draft_base.name} has num_nextn_predict_layers "
                              f"{nextn_layers}, no NextN layers to draft with; pass an EAGLE3 draft with "
                              "--speculative-draft-model-path")
        nextn_layers = None  # an EAGLE3 draft with the DeepSeek schema and 0: as if absent (layer_setup.py:207-213)
    nextn = nextn_layers is not None
    if nextn:
        draft = nextn_draft(draft_base, nextn_layers)
        pool_layers = nextn_layers
    else:
        draft = draft_base
        pool_layers = draft_base.num_hidden_layers  # max(num_hidden_layers, num_attention_layers)
    # eagle_draft_num_layers: the draft's (path given) or the *target's* config (path-less), spec_aux:168-178
    if path_given:
        budget_layers = nextn_layers if nextn else pool_layers
    else:
        budget_layers = _nextn_layers(model.hf_config) or 0
        if budget_layers == 0:
            notes.append(f"path-less draft: SGLang reads the target config's num_nextn_predict_layers (none on "
                         f"{model.architecture}), so the target's budget reserves nothing for the draft pool; it "
                         "is allocated from the headroom (pass --speculative-draft-model-path to reserve it)")
    if algorithm == "EAGLE3" and nextn:
        raise SizingError(f"--speculative-algorithm EAGLE3: {draft_base.name} is an MTP checkpoint; EAGLE3 needs an "
                          "EAGLE3 draft (e.g. LlamaForCausalLMEagle3)")

    # ---- steps, topk, draft tokens (speculative_hook.py:1159-1174, :1255-1266)
    steps, topk, tokens = args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens
    auto = steps is None
    if auto:
        if topk is not None or tokens is not None:
            raise SizingError("--speculative-eagle-topk / --speculative-num-draft-tokens without "
                              "--speculative-num-steps: SGLang 0.5.23 asserts (speculative_hook.py:1159-1163); give "
                              "all three or none")
        steps, topk, tokens = resolve_auto_params(algorithm, model.architecture)
    elif topk is None:
        raise SizingError("--speculative-num-steps without --speculative-eagle-topk: SGLang 0.5.23 fails on the "
                          "unset topk (speculative_hook.py:1274); give --speculative-eagle-topk")
    for flag, value in (("--speculative-num-steps", steps), ("--speculative-eagle-topk", topk)):
        if value < 1:
            raise SizingError(f"{flag} {value} must be >= 1")
    if topk == 1:
        if tokens is not None and tokens != steps + 1:
            notes.append(f"speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 = {steps + 1} "
                         "when speculative_eagle_topk == 1")
        tokens = steps + 1
    elif tokens is None:
        raise SizingError(f"--speculative-eagle-topk {topk} needs --speculative-num-draft-tokens")
    elif tokens < 2:
        raise SizingError(f"--speculative-num-draft-tokens {tokens} must be >= 2")

    # ---- acceptance (poolsim's own flags)
    accept = args.speculative_accept_length
    if accept is not None and args.speculative_accept_file is not None:
        raise SizingError("--speculative-accept-length and --speculative-accept-file: give one")
    if accept is not None and not (math.isfinite(accept) and 1.0 <= accept <= steps + 1):
        raise SizingError(f"--speculative-accept-length {accept}: a verify step commits 1 to "
                          f"num_steps + 1 = {steps + 1} tokens (bonus included)")
    return SpeculativeConfig(
        algorithm=algorithm, requested=str(requested), num_steps=steps, eagle_topk=topk, num_draft_tokens=tokens,
        auto_params=auto, draft=draft, draft_source=source, budget_draft_layers=int(budget_layers),
        draft_pool_layers=int(pool_layers), nextn=nextn, accept_length=accept,
        accept_file=args.speculative_accept_file, notes=tuple(notes))


def check_backend(spec: SpeculativeConfig, backend: str, page_size: int) -> None:
    """The backend checks of _handle_eagle_family (speculative_hook.py:1176-1180, :1268-1282)."""
    if backend == "trtllm_mha" and spec.eagle_topk > 1:
        raise SizingError(f"--speculative-eagle-topk {spec.eagle_topk}: the trtllm_mha backend only supports topk 1 "
                          "for speculative decoding")
    if spec.eagle_topk > 1 and page_size > 1 and backend not in PAGE_TREE_BACKENDS:
        raise SizingError(f"--speculative-eagle-topk {spec.eagle_topk} with page size {page_size} is only supported on "
                          f"{', '.join(PAGE_TREE_BACKENDS)}; got attention backend {backend}")


def draft_weight_bytes(spec: SpeculativeConfig, tp: int, gpu_arch: str = "sm90") -> int:
    """What the draft worker holds on one rank when the target's pool is sized: everything it built, its own
    embedding and head included (they are swapped for the target's later, eagle_worker_v2.py:243-258)."""
    return spec.draft.weight_bytes_per_rank(tp, gpu_arch)


def draft_state_bytes(per_req: int, num_draft_tokens: int, capped_reqs: int) -> int:
    """The verify buffers of a hybrid target: ``per_req x (capped_reqs + 1) x draft tokens``, SGLang's budget for
    the intermediate SSM and conv-window states (kv_cache_configurator.py:3305-3371)."""
    return per_req * (capped_reqs + 1) * num_draft_tokens
