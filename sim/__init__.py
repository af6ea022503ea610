"""poolsim sim."""
