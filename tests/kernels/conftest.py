"""Kernel tests run the Triton kernels on CUDA when there is a GPU, else in Triton's CPU interpreter.

``TRITON_INTERPRET`` must be set before a kernel module is imported (``@triton.jit`` reads it then), so it
is set here, at collection, and only without CUDA.
"""

import importlib.util
import os

HAS_TORCH = importlib.util.find_spec("torch") is not None

if HAS_TORCH:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
else:
    collect_ignore_glob = ["test_*.py"]  # torch is optional for the project; these tests need it
