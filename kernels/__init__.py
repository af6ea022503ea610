"""poolsim kernels."""
