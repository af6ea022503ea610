"""SGLang 0.5.23's sizing: server flags and the defaults it derives, the KV, request-row and mamba pools that fit
in GPU memory, and the concurrency that follows."""
