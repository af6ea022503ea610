"""The hardware poolsim sizes and times for: the GPU catalog."""
