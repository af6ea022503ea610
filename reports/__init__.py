"""poolsim reports."""
