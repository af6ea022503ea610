"""A model's shapes as SGLang 0.5.23 reads them from a Hugging Face ``config.json``: the common description.

``ModelConfig.load`` takes a path (a ``config.json`` or the folder holding one) or a catalog name
(``pools/model/catalog/<name>.json``). Each architecture family's module in ``pools/model/families/`` parses
its configs into this one description (layers, heads, head dims, MLA ranks, linear-attention state,
sliding windows, the DSA indexer, context length, dtype, quantization); ``weight_tensors`` lists every
weight tensor so that total, activated and per-rank weight bytes are counted from the shapes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from poolsim.pools.dtypes import dtype_bytes
from poolsim.pools.mem_cache.pool.mamba import MambaStateShape

CATALOG_DIR = Path(__file__).with_name("catalog")
CATALOG_ALIASES = {"deepseek-r1": "deepseek-v3"}  # R1 ships V3's architecture and shapes

LINEAR_MIXERS = ("kda", "gdn", "mamba2", "short_conv")
VOCAB_PADDING = 64  # DEFAULT_VOCAB_PADDING_SIZE, layers/vocab_parallel_embedding.py:48

MXFP4_BLOCK = 32  # values per shared uint8 scale (quantization/mxfp4.py)


@dataclass(frozen=True)
class LayerSpec:
    mixer: str  # attention | kda | gdn | mamba2 | short_conv | none (a Nemotron-H MLP/MoE-only block)
    mlp: str  # dense | moe | moe+dense (Grok's residual MoE) | none
    sliding_window: int = 0  # tokens an attention layer sees (0: full attention)


@dataclass(frozen=True)
class MoESpec:
    num_experts: int
    top_k: int
    intermediate_size: int  # per routed expert
    shared_intermediate_size: int = 0  # all shared experts together
    gated: bool = True  # SwiGLU gate+up+down; False: relu2 up+down (Nemotron-H)
    shared_expert_gate: bool = False  # Qwen3-Next's sigmoid gate on the shared expert
    score_bias: bool = False  # e_score_correction_bias (noaux_tc routers)
    router_dtype_bytes: int | None = None  # a router kept in float32 (Grok, GLM-4.7-Flash); None: model dtype
    expert_bias: bool = False  # per-expert biases on w13 and w2 (gpt-oss)
    # Latent MoE (Nemotron-H ``moe_latent_size``, Kimi-K3 ``routed_expert_hidden_size``): the routed experts
    # work in a ``latent_size``-wide space between two replicated projections hidden -> latent -> hidden
    # (nemotron_h.py:260-345, kimi_k3.py:449-685); the router and the shared experts stay on the hidden size.
    latent_size: int = 0  # 0: the experts work on the hidden size
    latent_norm: bool = False  # an RMSNorm over the latent (Kimi-K3 latent_moe_use_norm)
    latent_quantized: bool = True  # the projections take the checkpoint's quantization (Nemotron-H; not K3)
    # MXFP4 experts whose storage depends on the GPU (Kimi-K3): packed only on these archs, where the
    # model override picks a packed MXFP4 runner; elsewhere SGLang's auto runner upcasts them to the
    # model dtype after loading (quantization/mxfp4.py:1115-1136). None: packed everywhere (gpt-oss).
    mxfp4_packed_archs: tuple[str, ...] | None = None


@dataclass(frozen=True)
class DSASpec:
    """DeepSeek sparse attention's indexer (``index_*`` fields of DeepSeek-V3.2's config)."""

    index_n_heads: int
    index_head_dim: int
    index_topk: int


@dataclass(frozen=True)
class SWASpec:
    """The sliding-window geometry where it differs from the full layers (``swa_*`` of SGLang's ModelConfig)."""

    num_key_value_heads: int
    head_dim: int
    v_head_dim: int
    hybrid_pool: bool  # on SGLang's hybrid-SWA allowlist: a separate, smaller SWA pool
    num_attention_heads: int = 0  # query heads of the windowed layers (0: as the full layers)


@dataclass(frozen=True)
class LinearAttnSpec:
    """A linear-attention mixer. Names follow the Mamba2 state shape SGLang builds:

    KDA: heads = k heads = ``num_heads``, dims = ``head_dim``. GDN: ``num_heads`` =
    linear_num_value_heads, ``num_k_heads`` = linear_num_key_heads (the n_groups),
    ``head_k_dim`` = linear_key_head_dim (the state size). Mamba2: ``num_k_heads`` = n_groups,
    ``head_k_dim`` = ssm_state_size. LFM2's short conv: ``head_dim`` = hidden_size, no SSM state.
    """

    kind: str  # kda | gdn | mamba2 | short_conv
    num_heads: int
    head_dim: int
    num_k_heads: int
    head_k_dim: int
    conv_kernel: int
    full_rank_gate: bool = False  # KDA: a full-rank output gate g_proj instead of g_a/g_b (Kimi-K3)

    def state_shape(self, tp: int) -> MambaStateShape:
        """Per-slot state shapes on one rank (``mamba2_cache_params`` of the model's config class)."""
        if self.kind == "kda":
            return MambaStateShape.kimi_linear(tp, self.num_heads, self.head_dim, self.conv_kernel)
        if self.kind == "short_conv":  # Lfm2Config.mamba2_cache_params: num_heads=tp, state_size=0
            return MambaStateShape.mamba2(tp, intermediate_size=self.head_dim, n_groups=1, num_heads=tp,
                                          head_dim=self.head_dim, state_size=0, conv_kernel=self.conv_kernel,
                                          kind=self.kind)
        return MambaStateShape.mamba2(tp, intermediate_size=self.num_heads * self.head_dim,
                                      n_groups=self.num_k_heads, num_heads=self.num_heads,
                                      head_dim=self.head_dim, state_size=self.head_k_dim,
                                      conv_kernel=self.conv_kernel, kind=self.kind)


@dataclass(frozen=True)
class WeightTensor:
    """One weight tensor (``count`` copies of it), with how tensor parallelism shards it."""

    name: str
    out_features: int
    in_features: int
    count: int = 1
    shard: str = "rep"  # col (out/tp) | row (in/tp) | rep | kv_heads | vocab | pad8_rows | at_tp
    active: float = 1.0  # share of the copies one token uses (routed experts: top_k / num_experts)
    quantized: bool = False  # a linear weight an fp8 checkpoint stores in fp8
    dtype_bytes: int | None = None  # fixed storage width (fp32 parameters); None: the model's
    head_dim: int = 0  # kv_heads, pad8_rows: the head dim; at_tp: the tp size
    runtime_copy: bool = False  # a buffer SGLang derives after loading; not a checkpoint parameter
    pad: int = 0  # the sharded dim per rank rounded up to a multiple of this (FusedMoE's expert padding)
    archs: tuple[str, ...] | None = None  # held only on these GPU archs (None: on every one)

    @property
    def numel(self) -> int:
        return self.out_features * self.in_features * self.count

    def shape_per_rank(self, tp: int) -> tuple[int, int]:
        out, inp = self.out_features, self.in_features
        if self.shard == "col":
            return _pad(-(-out // tp), self.pad), inp
        if self.shard == "row":
            return out, _pad(-(-inp // tp), self.pad)
        if self.shard == "kv_heads":  # replicated once tp exceeds the kv heads (QKVParallelLinear)
            return max(1, out // self.head_dim // tp) * self.head_dim, inp
        if self.shard == "vocab":
            padded = -(-out // VOCAB_PADDING) * VOCAB_PADDING
            return -(-padded // tp), inp
        if self.shard == "pad8_rows":  # zero rows that pad head_dim + out/tp merged rows to a multiple of 8
            return (-(self.head_dim + -(-out // tp))) % 8, inp
        if self.shard == "at_tp":  # a post-load buffer built only at tp == head_dim (a kernel compiled for it)
            return (out, inp) if tp == self.head_dim else (0, inp)
        return out, inp


def _pad(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple if multiple else n


@dataclass(frozen=True)
class ModelConfig:
    name: str
    source: str  # the config.json read
    architecture: str
    model_type: str
    hidden_size: int
    vocab_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int  # query/key head dim of the full-attention layers (MLA: nope + rope)
    v_head_dim: int
    attention_arch: str  # mha | mla
    derived_context_len: int  # get_context_length(hf_config)
    dtype: str  # the model dtype SGLang runs in (--dtype auto)
    layers: tuple[LayerSpec, ...]
    intermediate_size: int = 0  # dense MLP
    dense_mlp_gated: bool = True
    moe: MoESpec | None = None
    linear_attn: LinearAttnSpec | None = None
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    q_lora_rank: int | None = None
    quant_method: str | None = None  # fp8 | mxfp4 (experts only) | None
    weight_block_size: tuple[int, int] | None = None
    kv_cache_quant_fp8: bool = False  # quantization_config.kv_cache_quant_algo == FP8
    mamba_ssm_dtype: str | None = None  # config's mamba_ssm_dtype, where SGLang reads it
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    attn_output_gate: bool = False
    norms_per_layer: int | None = None  # None: one per mixer and one per MLP
    extra_weights: tuple[WeightTensor, ...] = ()  # family-specific tensors the generic list lacks
    dsa: DSASpec | None = None
    swa: SWASpec | None = None  # set when some attention layers have a sliding window
    embed_replicated: bool = False  # a plain nn.Embedding (Gemma): the whole table on every rank
    # SGLang's is_multimodal (configs/model_config.py:820-828): the KV budget reserves the multimodal
    # embedding cache, and prefill CUDA graphs need the arch on the breakable-graph allowlist (:2501-2516)
    is_multimodal: bool = False
    multimodal_prefill_graph: bool = False
    # (num_hidden_layers, hidden_size) SGLang reads off vision_config to shrink mem_fraction_static for a VLM,
    # with its defaults 24 and 1024 for a missing attribute (memory_hook.py:439-441); None: no vision_config
    vit_size: tuple[int, int] | None = None
    notes: tuple[str, ...] = ()  # assumptions made while reading the config (plan prints them)
    hf_config: dict = field(default_factory=dict, repr=False, compare=False, hash=False)

    # ---- loading -----------------------------------------------------------------------------

    @staticmethod
    def catalog_names() -> list[str]:
        return sorted(p.stem for p in CATALOG_DIR.glob("*.json"))

    @staticmethod
    def load(name_or_path: str | Path, flag: str = "--model") -> "ModelConfig":
        """A config.json path (or a folder holding one) or a catalog name; ``flag``: the option that named it, for
        the error."""
        path = Path(name_or_path).expanduser()
        if path.is_dir():
            path = path / "config.json"
        if path.is_file():
            return ModelConfig.from_file(path)
        key = str(name_or_path).strip().lower()
        key = CATALOG_ALIASES.get(key, key)
        bundled = CATALOG_DIR / f"{key}.json"
        if bundled.is_file():
            return ModelConfig.from_file(bundled, name=str(name_or_path).strip().lower())
        raise ValueError(f"{flag} {name_or_path!r} is neither a config.json nor a catalog name; "
                         f"known: {', '.join(ModelConfig.catalog_names() + sorted(CATALOG_ALIASES))}")

    @staticmethod
    def from_file(path: str | Path, name: str | None = None) -> "ModelConfig":
        path = Path(path)
        try:
            cfg = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(cfg, dict):
            raise ValueError(f"{path}: a config.json holds one JSON object")
        return ModelConfig.from_dict(cfg, source=str(path), name=name or path.stem)

    @staticmethod
    def from_dict(cfg: dict, source: str = "<dict>", name: str = "model") -> "ModelConfig":
        from poolsim.pools.model.families import parse

        return parse(cfg, source, name)

    # ---- layers --------------------------------------------------------------------------------

    @property
    def full_attention_layer_ids(self) -> list[int]:
        """Every attention layer (windowed ones too): the layers that hold per-token KV."""
        return [i for i, layer in enumerate(self.layers) if layer.mixer == "attention"]

    @property
    def swa_layer_ids(self) -> list[int]:
        return [i for i, layer in enumerate(self.layers) if layer.mixer == "attention" and layer.sliding_window]

    @property
    def sliding_window(self) -> int:
        """The largest window of the windowed layers (0: none)."""
        return max((layer.sliding_window for layer in self.layers), default=0)

    @property
    def is_hybrid_swa(self) -> bool:
        """Two KV pools (full and SWA): SGLang's is_hybrid_swa (configs/model_config.py:1213-1217)."""
        return self.swa is not None and self.swa.hybrid_pool and bool(self.swa_layer_ids)

    @property
    def linear_layer_ids(self) -> list[int]:
        return [i for i, layer in enumerate(self.layers) if layer.mixer in LINEAR_MIXERS]

    @property
    def is_hybrid(self) -> bool:
        return self.linear_attn is not None

    @property
    def use_mla(self) -> bool:
        return self.attention_arch == "mla"

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """Per layer, what a step-time model prices: mha | mla | kda | gdn | mamba2 | none."""
        return tuple(self.attention_arch if layer.mixer == "attention" else layer.mixer for layer in self.layers)

    def with_full_attention(self) -> "ModelConfig":
        """The same model with every linear-attention or sliding-window layer replaced by a full-attention layer."""
        if self.swa is not None and not self.is_hybrid:
            layers = tuple(replace(layer, sliding_window=0) for layer in self.layers)
            return replace(self, name=f"{self.name} (all full attention)", layers=layers, swa=None)
        if not self.is_hybrid:
            return self
        layers = tuple(LayerSpec("attention", layer.mlp) if layer.mixer in LINEAR_MIXERS else layer
                       for layer in self.layers)
        return replace(self, name=f"{self.name} (all {self.attention_arch.upper()})", layers=layers,
                       linear_attn=None, mamba_ssm_dtype=None)

    # ---- weights -------------------------------------------------------------------------------

    @property
    def weight_dtype(self) -> str:
        return {"fp8": "fp8_e4m3", "mxfp4": "mxfp4"}.get(self.quant_method, self.dtype)

    def weight_tensors(self, gpu_arch: str = "sm90") -> list[WeightTensor]:
        """The tensors on a GPU of ``gpu_arch`` (a few families store their experts per arch)."""
        return [t for t in _weight_tensors(self) if t.archs is None or gpu_arch in t.archs]

    def param_count(self) -> int:
        """Parameters in the checkpoint SGLang loads (the MTP/next-n layers are not loaded)."""
        return sum(t.numel for t in self.weight_tensors() if not t.runtime_copy)

    def active_param_count(self) -> int:
        """Parameters one token multiplies through: routed experts count top_k of num_experts.

        The input embedding is a lookup, not a matmul, so it is left out; the LM head is in.
        """
        return int(sum(t.numel * t.active for t in self.weight_tensors()
                       if not t.runtime_copy and t.name != "embed_tokens"))

    def weight_bytes_per_rank(self, tp: int, gpu_arch: str = "sm90", *, attn_tp: int | None = None,
                              dense_tp: int | None = None, ep: int = 1, skip: tuple[str, ...] = ()) -> int:
        """Bytes of weights (plus fp8 block scales and SGLang's post-load copies) on one tp rank.

        ``attn_tp``: under attention DP (``--attn-dp-size``), the attention projections and the input embedding
        shard over the attention-TP group of tp / attn_dp ranks instead of all tp (``weight_group``);
        ``dense_tp``: the dense MLP's width (``--moe-dense-tp-size 1`` replicates it). None: tp.
        ``ep``: expert parallelism: a rank holds num_experts / ep routed experts
        (``layers/moe/fused_moe_triton/layer.py:414-416``), each with its intermediate split over
        moe_tp = tp / ep ranks (``:427-428``; ``runtime_context.py:154``). ``skip``: tensor names a pipeline stage
        does not hold (``PPMissingLayer``: the embedding off the first stage, the LM head off the last).
        """
        model_bytes = dtype_bytes(self.dtype)
        widths = {"tp": tp, "attn_tp": attn_tp or tp, "dense_tp": dense_tp or tp, "experts": tp // ep}
        total = 0
        for t in self.weight_tensors(gpu_arch):
            if t.name in skip:
                continue
            group = weight_group(t)
            if group == "experts" and ep > 1:
                t = replace(t, count=t.count // ep)
            out, inp = t.shape_per_rank(widths[group])
            if t.dtype_bytes is not None:
                width = t.dtype_bytes
            elif t.quantized and self.quant_method == "fp8":
                width = 1
            elif t.quantized and self.quant_method == "mxfp4" and t.active < 1.0:
                # routed experts only: two e2m1 values per byte plus one uint8 scale per 32 values
                total += (out * inp // 2 + out * inp // MXFP4_BLOCK) * t.count
                continue
            else:
                width = model_bytes
            total += out * inp * width * t.count
            if t.quantized and self.quant_method == "fp8":
                if self.weight_block_size is not None:  # weight_scale_inv, float32 per block
                    bn, bk = self.weight_block_size
                    total += math.ceil(out / bn) * math.ceil(inp / bk) * 4 * t.count
                else:  # one float32 scale per tensor
                    total += 4 * t.count
        return total

    @property
    def weight_bytes_per_param(self) -> float:
        """Average stored bytes per parameter (1 plus scales for fp8 checkpoints, 2 for bf16)."""
        return self.weight_bytes_per_rank(1) / self.param_count()


def weight_group(t: WeightTensor) -> str:
    """Which process group shards a tensor: ``attn_tp`` for the attention projections (``parallel_group="attn_tp"``,
    models/deepseek_v2.py:2077-2161, models/qwen3.py:164-211) and the input embedding under attention DP
    (get_embedding_tp_kwargs, layers/vocab_parallel_embedding.py:182-185; models/qwen2.py:370-374);
    ``dense_tp`` for the dense MLP (models/deepseek_v2.py:2665); ``tp`` for the rest: the LM head
    (``use_attn_tp_group=enable_dp_lm_head``, off by default: models/deepseek_v2.py:3291-3296), the MoE experts,
    the shared experts (models/deepseek_v2.py:888-896) and replicated tensors; ``experts`` for the routed experts
    (``tp`` without expert parallelism)."""
    if t.name.startswith("attn.") or t.name == "embed_tokens":
        return "attn_tp"
    if t.name.startswith("moe.experts."):  # FusedMoE's routed experts: moe_tp wide, num_experts / ep of them
        return "experts"
    if t.name.startswith("mlp."):
        return "dense_tp"
    return "tp"


def _weight_tensors(m: ModelConfig) -> list[WeightTensor]:
    """Every weight tensor of the model as SGLang builds it (``srt/models/*.py``), with its tp sharding."""
    h = m.hidden_size
    n_attn = sum(1 for layer in m.layers if layer.mixer == "attention")
    n_dense = sum(1 for layer in m.layers if layer.mlp in ("dense", "moe+dense"))
    n_moe = sum(1 for layer in m.layers if layer.mlp in ("moe", "moe+dense"))
    n_norms = sum(1 for layer in m.layers if layer.mixer != "none") + sum(1 for layer in m.layers
                                                                        if layer.mlp != "none")
    if m.norms_per_layer is not None:
        n_norms = m.norms_per_layer * len(m.layers)  # e.g. one norm per Nemotron-H block
    W = WeightTensor
    # VocabParallelEmbedding shards the padded vocabulary; Gemma's nn.Embedding keeps all of it per rank
    embed_shard = "rep" if m.embed_replicated else "vocab"
    ts = [W("embed_tokens", m.vocab_size, h, shard=embed_shard), W("norms", h, 1, n_norms + 1)]
    if not m.tie_word_embeddings:
        ts.append(W("lm_head", m.vocab_size, h, shard="vocab"))

    if n_attn and m.attention_arch == "mha":
        swa = m.swa
        n_swa = len(m.swa_layer_ids)
        if swa is not None and n_swa and (swa.num_attention_heads or m.num_attention_heads, swa.num_key_value_heads,
                                          swa.head_dim, swa.v_head_dim) != (m.num_attention_heads,
                                                                            m.num_key_value_heads, m.head_dim,
                                                                            m.v_head_dim):
            # windowed layers with their own head geometry (Gemma 4, MiMo-V2): their projections are sized
            # by it (gemma4_causal.py:330-375)
            ts += _mha_tensors(m, "attn", m.num_attention_heads, m.num_key_value_heads, m.head_dim,
                               m.v_head_dim, n_attn - n_swa)
            ts += _mha_tensors(m, "attn.swa", swa.num_attention_heads or m.num_attention_heads,
                               swa.num_key_value_heads, swa.head_dim, swa.v_head_dim, n_swa)
        else:
            ts += _mha_tensors(m, "attn", m.num_attention_heads, m.num_key_value_heads, m.head_dim,
                               m.v_head_dim, n_attn)
    elif n_attn:  # MLA (deepseek_v2.py DeepseekV2AttentionMLA)
        heads = m.num_attention_heads
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            ts += [W("attn.q_a_proj", m.q_lora_rank, h, n_attn, "rep", quantized=True),
                   W("attn.q_a_layernorm", m.q_lora_rank, 1, n_attn),
                   W("attn.q_b_proj", heads * qk, m.q_lora_rank, n_attn, "col", quantized=True)]
        else:
            ts.append(W("attn.q_proj", heads * qk, h, n_attn, "col", quantized=True))
        kv_b_out = heads * (m.qk_nope_head_dim + m.v_head_dim)
        ts += [W("attn.kv_a_proj_with_mqa", m.kv_lora_rank + m.qk_rope_head_dim, h, n_attn, "rep", quantized=True),
               W("attn.kv_a_layernorm", m.kv_lora_rank, 1, n_attn),
               W("attn.kv_b_proj", kv_b_out, m.kv_lora_rank, n_attn, "col", quantized=True),
               W("attn.o_proj", h, heads * m.v_head_dim, n_attn, "row", quantized=True),
               # post_load_weights splits kv_b_proj into w_kc / w_vc copies in the model dtype
               # (deepseek_common/deepseek_weight_loader.py:700-790, kimi_linear.py:1000-1011)
               W("attn.w_kc_w_vc", kv_b_out, m.kv_lora_rank, n_attn, "col", active=0.0, runtime_copy=True)]

    la = m.linear_attn
    n_lin = len(m.linear_layer_ids)
    if la is not None and la.kind == "kda" and la.full_rank_gate:
        # KimiK3DeltaAttention (kimi_k3.py:1552-1600): fused q,k,v,g; the forget gate keeps its f_a/f_b
        # low rank; post_load merges f_a and b_proj into one buffer padded to 8 rows (:1813-1852)
        proj = la.num_heads * la.head_dim
        ts += [W("kda.q_k_v_g_proj", 4 * proj, h, n_lin, "col", quantized=True),
               W("kda.b_proj", la.num_heads, h, n_lin, "col", quantized=True),
               W("kda.f_a_proj", la.head_dim, h, n_lin, "rep", quantized=True),
               W("kda.f_b_proj", proj, la.head_dim, n_lin, "col", quantized=True),
               W("kda.bfa_pad_rows", la.num_heads, h, n_lin, "pad8_rows", head_dim=la.head_dim, runtime_copy=True),
               W("kda.dt_bias", proj, 1, n_lin, "col", dtype_bytes=4),
               W("kda.qkv_conv1d", 3 * proj, la.conv_kernel, n_lin, "col", dtype_bytes=4),
               W("kda.A_log", la.num_heads, 1, n_lin, "col", dtype_bytes=4),
               W("kda.o_norm", la.head_dim, 1, n_lin),
               W("kda.o_proj", h, proj, n_lin, "row", quantized=True)]
    elif la is not None and la.kind == "kda":  # kimi_linear.py KimiDeltaAttention
        proj = la.num_heads * la.head_dim
        ts += [W("kda.q_k_v_proj", 3 * proj, h, n_lin, "col", quantized=True),
               W("kda.b_proj", la.num_heads, h, n_lin, "col", quantized=True),
               W("kda.f_a_g_a_proj", 2 * la.head_dim, h, n_lin, "rep", quantized=True),
               W("kda.f_b_g_b_proj", 2 * proj, la.head_dim, n_lin, "col", quantized=True),
               W("kda.dt_bias", proj, 1, n_lin, "col", dtype_bytes=4),
               W("kda.qkv_conv1d", 3 * proj, la.conv_kernel, n_lin, "col", dtype_bytes=4),
               W("kda.A_log", la.num_heads, 1, n_lin, "col", dtype_bytes=4),
               W("kda.o_norm", la.head_dim, 1, n_lin),
               W("kda.o_proj", h, proj, n_lin, "row", quantized=True)]
    elif la is not None and la.kind == "gdn":  # qwen3_next.py Qwen3GatedDeltaNet
        key_dim, value_dim = la.num_k_heads * la.head_k_dim, la.num_heads * la.head_dim
        ts += [W("gdn.in_proj_qkvz", 2 * key_dim + 2 * value_dim, h, n_lin, "col", quantized=True),
               W("gdn.in_proj_ba", 2 * la.num_heads, h, n_lin, "col", quantized=True),
               W("gdn.conv1d", 2 * key_dim + value_dim, la.conv_kernel, n_lin, "col"),
               W("gdn.dt_bias", la.num_heads, 1, n_lin, "col"),
               W("gdn.A_log", la.num_heads, 1, n_lin, "col", dtype_bytes=4),
               W("gdn.norm", la.head_dim, 1, n_lin),
               W("gdn.out_proj", h, value_dim, n_lin, "row", quantized=True)]
    elif la is not None and la.kind == "short_conv":  # models/lfm2.py Lfm2ShortConv (conv_bias false)
        ts += [W("conv.in_proj", 3 * la.head_dim, h, n_lin, "col", quantized=True),
               W("conv.conv_weight", la.head_dim, la.conv_kernel, n_lin, "col"),
               W("conv.out_proj", h, la.head_dim, n_lin, "row", quantized=True)]
    elif la is not None:  # mamba2 (layers/attention/mamba/mamba.py MambaMixer2)
        inner = la.num_heads * la.head_dim
        conv_dim = inner + 2 * la.num_k_heads * la.head_k_dim
        ts += [W("mamba.in_proj", inner + conv_dim + la.num_heads, h, n_lin, "col", quantized=True),
               W("mamba.conv1d", conv_dim, la.conv_kernel + 1, n_lin, "col"),  # weight + bias
               W("mamba.A_D_dt_bias", 3 * la.num_heads, 1, n_lin, "col"),
               W("mamba.norm", inner, 1, n_lin, "col"),
               W("mamba.out_proj", h, inner, n_lin, "row", quantized=True)]

    mats = 3 if m.dense_mlp_gated else 2
    if n_dense:
        ts += [W("mlp.gate_up_proj", (mats - 1) * m.intermediate_size, h, n_dense, "col", quantized=True),
               W("mlp.down_proj", h, m.intermediate_size, n_dense, "row", quantized=True)]
    if n_moe and m.moe is not None:
        e = m.moe
        up = 2 if e.gated else 1
        eh = e.latent_size or h  # the width the routed experts work in
        ts.append(W("moe.gate", e.num_experts, h, n_moe, dtype_bytes=e.router_dtype_bytes))  # never quantized
        ts += _expert_tensors(e, eh, n_moe, up)
        if e.latent_size:  # ReplicatedLinear hidden -> latent and latent -> hidden
            ts += [W("moe.latent_proj", 2 * e.latent_size, h, n_moe, quantized=e.latent_quantized)]
            if e.latent_norm:
                ts.append(W("moe.latent_norm", e.latent_size, 1, n_moe))
        if e.expert_bias:
            ts += [W("moe.experts.w13_bias", up * e.intermediate_size, 1, n_moe * e.num_experts, "col",
                     active=e.top_k / e.num_experts),
                   W("moe.experts.w2_bias", h, 1, n_moe * e.num_experts, active=e.top_k / e.num_experts)]
        if e.score_bias:
            ts.append(W("moe.e_score_correction_bias", e.num_experts, 1, n_moe, dtype_bytes=4))
        if e.shared_intermediate_size:
            ts += [W("moe.shared.w13", up * e.shared_intermediate_size, h, n_moe, "col", quantized=True),
                   W("moe.shared.w2", h, e.shared_intermediate_size, n_moe, "row", quantized=True)]
        if e.shared_expert_gate:
            ts.append(W("moe.shared_expert_gate", 1, h, n_moe))
    return ts + list(m.extra_weights)


def _mha_tensors(m: ModelConfig, prefix: str, heads: int, kv: int, hd: int, vd: int, n: int) -> list[WeightTensor]:
    """One attention geometry's projections on ``n`` layers (QKVParallelLinear, RowParallelLinear)."""
    W = WeightTensor
    q_out = heads * hd * (2 if m.attn_output_gate else 1)  # Qwen3-Next packs the output gate with q
    ts = [W(f"{prefix}.q_proj", q_out, m.hidden_size, n, "col", quantized=True),
          W(f"{prefix}.k_proj", kv * hd, m.hidden_size, n, "kv_heads", quantized=True, head_dim=hd),
          W(f"{prefix}.v_proj", kv * vd, m.hidden_size, n, "kv_heads", quantized=True, head_dim=vd),
          W(f"{prefix}.o_proj", m.hidden_size, heads * vd, n, "row", quantized=True)]
    if m.attention_bias:
        ts.append(W(f"{prefix}.qkv_bias", heads * hd + 2 * kv * hd, 1, n, "col"))
    if m.qk_norm:
        ts.append(W(f"{prefix}.qk_norm", 2 * hd, 1, n))
    return [t for t in ts if t.count]


# Kimi-K3's MXFP4 experts by GPU (quantization/mxfp4.py): FusedMoE rounds the per-rank intermediate up
# (create_weights :444-634) and always creates the w13/w2 biases on CUDA (create_bias, :585), in bf16.
# sm100 (model_overrides/kimi_k3.py:172-190: flashinfer_mxfp4) keeps e2m1 + ue8m0 scales, pads to 128 and
# turns the biases into float32 plus three float32 scalars per expert (:735-1038). Elsewhere the auto
# runner upcasts the weights to bf16 and drops the scales (:1115-1136); its triton_kernels import pads to 64.
MXFP4_RUNTIME_PAD = {"packed": 128, "upcast": 64}


def _expert_tensors(e: MoESpec, eh: int, n_moe: int, up: int) -> list[WeightTensor]:
    W = WeightTensor
    count, active = n_moe * e.num_experts, e.top_k / e.num_experts
    if e.mxfp4_packed_archs is None:
        return [W("moe.experts.w13", up * e.intermediate_size, eh, count, "col", active=active, quantized=True),
                W("moe.experts.w2", eh, e.intermediate_size, count, "row", active=active, quantized=True)]
    packed, upcast = e.mxfp4_packed_archs, tuple(a for a in ("sm80", "sm89", "sm90") if a not in e.mxfp4_packed_archs)
    ts = []
    for archs, kind in ((packed, "packed"), (upcast, "upcast")):
        pad, q = MXFP4_RUNTIME_PAD[kind], kind == "packed"
        bias_bytes = 4 if q else 2
        # gate and up padded each: two col-sharded halves of intermediate_size
        ts += [W("moe.experts.w13", e.intermediate_size, eh, up * count, "col", active=active, quantized=q, pad=pad,
                 archs=archs),
               W("moe.experts.w2", eh, e.intermediate_size, count, "row", active=active, quantized=q, pad=pad,
                 archs=archs),
               W("moe.experts.w13_bias", e.intermediate_size, 1, up * count, "col", active=0.0, pad=pad,
                 dtype_bytes=bias_bytes, runtime_copy=True, archs=archs),
               W("moe.experts.w2_bias", eh, 1, count, active=0.0, dtype_bytes=bias_bytes, runtime_copy=True,
                 archs=archs)]
        if q:  # gemm1_alpha, gemm1_beta, gemm1_clamp_limit
            ts.append(W("moe.experts.gemm1_params", 3, 1, count, active=0.0, dtype_bytes=4, runtime_copy=True,
                        archs=archs))
    return ts
