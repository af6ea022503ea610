"""What every architecture family reads the same way from a config.json (``configs/model_config.py``).

A family subclasses ``Family`` (``ARCHITECTURES`` in ``__init__.py`` names the architectures it reads) and
implements ``parse_layers`` (layer kinds, attention geometry, MoE, linear-attention state); the common fields
(hidden size, vocabulary, context length, dtype, quantization) come from here. Every missing or malformed field is a one-line ValueError
that names the file and the field.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from poolsim.pools.model.config import LayerSpec, ModelConfig

# srt/utils/hf_transformers/common.py:668, in SGLang's order of preference
CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                       "max_position_embeddings")
DTYPE_NAMES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "half": "float16",
               "fp16": "float16", "float32": "float32", "float": "float32"}
QUANT_METHODS = ("fp8", "mxfp4")


class Family(ABC):
    notes: tuple[str, ...] = ()  # assumptions a plan prints (the plain-decoder fallback)

    def __init__(self, cfg: dict, source: str, arch: str):
        self.top = cfg  # the file as read (quantization_config, architectures live here)
        self.cfg = cfg  # the text model's fields (text_config for multimodal wrappers)
        self.prefix = ""  # how error messages name a field of self.cfg ("text_config.")
        self.source = source
        self.arch = arch

    # ---- field access ---------------------------------------------------------------------------

    def need(self, key: str, where: dict | None = None, what: str | None = None):
        d = self.cfg if where is None else where
        value = d.get(key) if isinstance(d, dict) else None
        if value is None:
            raise ValueError(f"{self.source}: missing field '{what or self.prefix + key}' needed for {self.arch}")
        return value

    def get(self, key: str, default=None):
        value = self.cfg.get(key)
        return default if value is None else value

    def need_int(self, key: str, where: dict | None = None, what: str | None = None, minimum: int = 1) -> int:
        """A count or size: an integer >= ``minimum`` (a string head count or zero KV heads is refused)."""
        value = self.need(key, where, what)
        return self.check_int(value, what or self.prefix + key, minimum)

    def get_int(self, key: str, default: int, minimum: int = 0) -> int:
        value = self.cfg.get(key)
        return default if value is None else self.check_int(value, self.prefix + key, minimum)

    def check_int(self, value, what: str, minimum: int = 1) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{self.source}: field '{what}' is {value!r}; expected an integer")
        if value < minimum:
            raise ValueError(f"{self.source}: field '{what}' is {value}; must be >= {minimum}")
        return value

    def int_list(self, key: str, length: int | None = None) -> list:
        value = self.need(key)
        if not isinstance(value, list) or (length is not None and len(value) != length):
            want = f"a list of {length} entries" if length is not None else "a list"
            raise ValueError(f"{self.source}: field '{self.prefix + key}' is not {want}")
        return value

    # ---- parse ----------------------------------------------------------------------------------

    def parse(self, name: str) -> ModelConfig:
        fields = {**self.common(), **self.parse_layers()}
        if fields.get("num_hidden_layers") is None:
            fields["num_hidden_layers"] = len(fields["layers"])
        return ModelConfig(name=name, notes=self.notes, **fields)

    @abstractmethod
    def parse_layers(self) -> dict:
        """The family's fields of ModelConfig: layers, attention geometry, MoE, linear attention."""

    def common(self) -> dict:
        return dict(
            source=self.source, architecture=self.arch, model_type=self.get("model_type", ""),
            hidden_size=self.need_int("hidden_size"), vocab_size=self.need_int("vocab_size"),
            num_attention_heads=self.need_int("num_attention_heads"),
            derived_context_len=self.context_length(), dtype=self.model_dtype(),
            tie_word_embeddings=bool(self.top.get("tie_word_embeddings", self.get("tie_word_embeddings", False))),
            hf_config=self.top, **self.quantization(),
        )

    def num_layers(self) -> int:
        return self.need_int("num_hidden_layers")

    def context_length(self) -> int:
        """``get_context_length``: the first of CONTEXT_LENGTH_KEYS, times the rope factor
        unless the scaling names original_max_position_embeddings or is llama3."""
        rope = self.cfg.get("rope_scaling") or {}
        factor = rope.get("factor", 1) if rope else 1
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1
        for key in CONTEXT_LENGTH_KEYS:
            if self.cfg.get(key) is not None:
                return int(factor * self.check_int(self.cfg[key], self.prefix + key))
        return 2048

    def model_dtype(self) -> str:
        """``_get_and_verify_dtype`` with --dtype auto: config dtype, float32 -> float16."""
        raw = (self.cfg.get("dtype") or self.cfg.get("torch_dtype") or self.top.get("dtype")
               or self.top.get("torch_dtype") or "float32")
        if raw not in DTYPE_NAMES:
            raise ValueError(f"{self.source}: torch_dtype {raw!r} is not one of {', '.join(DTYPE_NAMES)}")
        return "float16" if DTYPE_NAMES[raw] == "float32" else DTYPE_NAMES[raw]

    def quantization(self) -> dict:
        q = self.top.get("quantization_config")
        if not q:
            return {}
        method = q.get("quant_method")
        if method not in QUANT_METHODS:
            raise ValueError(f"{self.source}: quantization_config.quant_method {method!r} is not supported "
                             f"(only {', '.join(QUANT_METHODS)}); weight bytes would be wrong")
        if method == "mxfp4":
            return dict(quant_method="mxfp4")
        kv_fp8 = str(q.get("kv_cache_quant_algo", "")).upper() == "FP8"
        block = q.get("weight_block_size")
        return dict(quant_method="fp8", weight_block_size=tuple(block) if block else None,
                    kv_cache_quant_fp8=kv_fp8)

    # ---- attention geometry ---------------------------------------------------------------------

    def mha(self) -> dict:
        heads = self.need_int("num_attention_heads")
        head_dim = self.cfg.get("head_dim")
        if head_dim is None:  # SGLang's default: hidden_size // num_attention_heads, which must then divide evenly
            hidden = self.need_int("hidden_size")
            if hidden % heads:
                raise ValueError(f"{self.source}: field '{self.prefix}hidden_size' {hidden} is not divisible by "
                                 f"'{self.prefix}num_attention_heads' {heads}, and no 'head_dim' is given")
            head_dim = hidden // heads
        else:
            head_dim = self.check_int(head_dim, "head_dim")
        v_head_dim = self.get_int("v_head_dim", head_dim, minimum=1)
        kv_heads = self.get_int("num_key_value_heads", heads, minimum=1)
        if heads % kv_heads:  # GQA: each KV head serves a whole group of query heads
            raise ValueError(f"{self.source}: field '{self.prefix}num_key_value_heads' {kv_heads} does not divide "
                             f"'{self.prefix}num_attention_heads' {heads}")
        return dict(attention_arch="mha", head_dim=head_dim, v_head_dim=v_head_dim,
                    num_key_value_heads=kv_heads,
                    attention_bias=bool(self.get("attention_bias", self.arch == "Qwen2ForCausalLM")),
                    qk_norm=self.cfg.get("model_type") in ("qwen3", "qwen3_moe", "qwen3_next", "qwen3_5_text",
                                                             "qwen3_5_moe_text"))

    def mla(self) -> dict:
        nope, rope = self.need_int("qk_nope_head_dim"), self.need_int("qk_rope_head_dim")
        heads = self.need_int("num_attention_heads")
        q_lora = self.cfg.get("q_lora_rank")
        return dict(attention_arch="mla", head_dim=nope + rope, v_head_dim=self.need_int("v_head_dim"),
                    num_key_value_heads=self.get_int("num_key_value_heads", heads, minimum=1),
                    kv_lora_rank=self.need_int("kv_lora_rank"), qk_rope_head_dim=rope, qk_nope_head_dim=nope,
                    q_lora_rank=None if q_lora is None else self.check_int(q_lora, "q_lora_rank"))

    # ---- MLP layouts ----------------------------------------------------------------------------

    def qwen_sparse_layers(self, n: int) -> list[str]:
        """Qwen-MoE: layer i is sparse unless in mlp_only_layers or off the decoder_sparse_step grid."""
        only = set(self.get("mlp_only_layers", []))
        step = self.get_int("decoder_sparse_step", 1, minimum=1)
        return ["moe" if i not in only and (i + 1) % step == 0 else "dense" for i in range(n)]

    def deepseek_sparse_layers(self, n: int) -> list[str]:
        first_dense = self.get_int("first_k_dense_replace", 0)
        freq = self.get_int("moe_layer_freq", 1, minimum=1)
        return ["moe" if i >= first_dense and i % freq == 0 else "dense" for i in range(n)]

    @staticmethod
    def attention_layers(mlp: list[str]) -> tuple[LayerSpec, ...]:
        return tuple(LayerSpec("attention", m) for m in mlp)
