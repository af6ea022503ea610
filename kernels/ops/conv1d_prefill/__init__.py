"""Variable-length causal depthwise conv1d for prefill over pool slots (SGLang ``causal_conv1d_fn``)."""
