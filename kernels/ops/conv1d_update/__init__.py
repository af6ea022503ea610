"""Causal depthwise conv1d state update for one decode token per request (SGLang ``causal_conv1d_update``)."""
