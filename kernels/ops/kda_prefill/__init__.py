"""KDA prefill over packed variable-length sequences, from and back into pool state slots."""
