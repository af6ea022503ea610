"""poolsim traces."""
