"""Vision towers a multimodal wrapper loads beside its text model: their weights take GPU memory too."""

from __future__ import annotations

from dataclasses import replace

from poolsim.pools.model.config import WeightTensor


def qwen3_vl_vision_tensors(vc: dict, source: str) -> tuple[WeightTensor, ...]:
    """``Qwen3_VisionTransformer`` (models/qwen3_vl.py; Qwen3.5 reuses it): Conv3d patch embedding, learned
    position table, ``depth`` pre-norm blocks (biased qkv/proj, GELU MLP), the patch merger, deepstack mergers."""
    try:
        h, depth, inter = int(vc["hidden_size"]), int(vc["depth"]), int(vc["intermediate_size"])
        out, merge = int(vc["out_hidden_size"]), int(vc.get("spatial_merge_size", 2))
        patch = int(vc.get("in_channels", 3)) * int(vc.get("temporal_patch_size", 2)) * int(vc["patch_size"]) ** 2
        positions = int(vc.get("num_position_embeddings", 0))
        deepstack = len(vc.get("deepstack_visual_indexes") or [])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{source}: vision_config lacks or mistypes {e}; its weights cannot be counted") from None
    merged = h * merge * merge
    W = WeightTensor
    merger = [W("visual.merger.norm", 2 * h, 1), W("visual.merger.fc1", merged, merged + 1, shard="col"),
              W("visual.merger.fc2", out, merged, shard="row"), W("visual.merger.fc2_bias", out, 1)]
    ts = [W("visual.patch_embed", h, patch + 1),  # weight + bias
          W("visual.pos_embed", positions, h),
          W("visual.norms", 4 * h, 1, depth),  # norm1, norm2: LayerNorm weight + bias
          W("visual.attn.qkv", 3 * h, h + 1, depth, "col"),  # weight + bias
          W("visual.attn.proj", h, h, depth, "row"), W("visual.attn.proj_bias", h, 1, depth),
          W("visual.mlp.fc1", inter, h + 1, depth, "col"),
          W("visual.mlp.fc2", h, inter, depth, "row"), W("visual.mlp.fc2_bias", h, 1, depth)]
    for t in merger:  # the main merger, then one per deepstack index
        ts.append(t)
        if deepstack:
            ts.append(W(t.name.replace("merger", "deepstack_merger"), t.out_features, t.in_features, deepstack,
                        t.shard))
    # a text token never multiplies through the tower: active 0 keeps it out of the per-token FLOPs
    return tuple(replace(t, active=0.0) for t in ts if t.numel)


def gemma4_vision_tensors(vc: dict, text_hidden: int, source: str) -> tuple[WeightTensor, ...]:
    """``Gemma4VisionEncoder`` (models/gemma4_vision.py) and ``embed_vision`` (gemma4_mm.py:92-136): a patch
    projection and a two-axis position table, ``num_hidden_layers`` blocks (fused QKV and gated GELU MLP
    sharded over attention TP, q/k norms, a weightless v norm, four RMSNorms, a layer scalar), the
    standardization buffers, and the projection into the text model."""
    try:
        h, depth, inter = int(vc["hidden_size"]), int(vc["num_hidden_layers"]), int(vc["intermediate_size"])
        heads, kv = int(vc["num_attention_heads"]), int(vc.get("num_key_value_heads", vc["num_attention_heads"]))
        hd, patch = int(vc.get("head_dim", h // heads)), int(vc["patch_size"])
        positions = int(vc["position_embedding_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{source}: vision_config lacks or mistypes {e}; its weights cannot be counted") from None
    if vc.get("attention_bias"):
        raise ValueError(f"{source}: field 'vision_config.attention_bias' is set; poolsim counts Gemma 4's vision "
                         "tower without attention biases")
    W = WeightTensor
    ts = [W("visual.patch_embed", h, 3 * patch * patch),  # nn.Linear, no bias (:427-429)
          W("visual.pos_embed", 2 * positions, h),  # position_embedding_table (:430-432)
          W("visual.attn.q_proj", heads * hd, h, depth, "col"),
          W("visual.attn.kv_proj", kv * hd, h, 2 * depth, "kv_heads", head_dim=hd),  # k and v
          W("visual.attn.o_proj", h, heads * hd, depth, "row"),
          W("visual.attn.qk_norm", 2 * hd, 1, depth),
          W("visual.attn.v_norm", hd, 1, depth, runtime_copy=True),  # a buffer of ones
          W("visual.mlp.gate_up", 2 * inter, h, depth, "col"),
          W("visual.mlp.down", h, inter, depth, "row"),
          W("visual.norms", 4 * h, 1, depth),
          W("visual.layer_scalar", 1, 1, depth),
          W("visual.embed_projection", text_hidden, h),  # Gemma4MultimodalEmbedder, replicated
          W("visual.embed_norm", h, 1, runtime_copy=True)]
    if vc.get("standardize"):
        ts.append(W("visual.std_bias_scale", 2 * h, 1))  # std_bias, std_scale (:576-579)
    # a text token never multiplies through the tower: active 0 keeps it out of the per-token FLOPs
    return tuple(replace(t, active=0.0) for t in ts)


def kimi_k3_vision_tensors(vc: dict, text_hidden: int, source: str) -> tuple[WeightTensor, ...]:
    """``KimiK3VisionTower`` and ``KimiK3MultiModalProjector`` (models/kimi_k3_vl.py): plain nn modules, so every
    rank holds all of them (the tower runs data-parallel). A Conv2d patch embedding, a learned H x W position
    table (plus a float32 time table), ``vt_num_hidden_layers`` blocks (two norms, fused wqkv, wo, a two-layer
    MLP), a final norm; the projector is two Linears over 2 x 2 merged patches and a post RMSNorm."""
    try:
        h = int(vc.get("vt_hidden_size") or vc["hidden_size"])
        depth = int(vc.get("vt_num_hidden_layers") or vc["num_hidden_layers"])
        inter = int(vc.get("vt_intermediate_size") or vc["intermediate_size"])
        qkv = int(vc.get("qkv_hidden_size") or h)
        patch = int(vc["patch_size"])
        pos_h, pos_w, frames = int(vc["init_pos_emb_height"]), int(vc["init_pos_emb_width"]), int(vc["init_pos_emb_time"])
        merge_h, merge_w = (int(x) for x in vc.get("merge_kernel_size", (2, 2)))
        mm_hidden = int(vc.get("mm_hidden_size") or h)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{source}: vision_config lacks or mistypes {e}; its weights cannot be counted") from None
    norm = {"rmsnorm": 1, "layernorm": 2}.get(vc.get("norm_type", "layernorm"))  # weight (+ bias)
    if norm is None:
        raise ValueError(f"{source}: field 'vision_config.norm_type' is {vc.get('norm_type')!r}; expected rmsnorm "
                         "or layernorm")
    linear_bias, attn_bias = bool(vc.get("linear_bias", True)), bool(vc.get("attn_bias", False))
    merged = mm_hidden * merge_h * merge_w
    W = WeightTensor
    ts = [W("visual.patch_embed", h, 3 * patch * patch + bool(vc.get("patch_embed_proj_bias", True))),
          W("visual.pos_embed", pos_h * pos_w, h),
          W("visual.time_pos_embed", frames, h, dtype_bytes=4, runtime_copy=True),  # a float32 sincos buffer
          W("visual.norms", 2 * norm * h, 1, depth),
          W("visual.attn.wqkv", 3 * qkv, h + attn_bias, depth),
          W("visual.attn.wo", h, qkv + attn_bias, depth),
          W("visual.mlp.fc0", inter, h + linear_bias, depth),
          W("visual.mlp.fc1", h, inter + linear_bias, depth),
          W("visual.final_norm", norm * h, 1),
          W("visual.projector.fc0", merged, merged), W("visual.projector.fc1", text_hidden, merged),
          W("visual.projector.post_norm", text_hidden, 1)]
    return tuple(replace(t, active=0.0) for t in ts)


def vit_size(vc: dict, layers: str = "num_hidden_layers", hidden: str = "hidden_size") -> tuple[int, int]:
    """The ViT size ``adjust_mem_fraction_for_vlm`` reads: ``getattr(vision_config, "num_hidden_layers", 24)`` and
    ``getattr(..., "hidden_size", 1024)`` (memory_hook.py:439-441). Qwen3-VL's vision config names its depth
    ``depth``, so SGLang reads the default 24 there."""
    return int(vc.get(layers) or 24), int(vc.get(hidden) or 1024)
