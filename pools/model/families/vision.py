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
