import importlib.util
import os

import pytest

HAS_TORCH = importlib.util.find_spec("torch") is not None
DEVICES = [None] + (["cpu"] if HAS_TORCH else [])


def pytest_collection_modifyitems(config, items):
    has_cuda = False
    if HAS_TORCH:
        import torch

        has_cuda = torch.cuda.is_available()
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device (GPU-only check)"))


@pytest.fixture(params=DEVICES, ids=lambda d: "numpy" if d is None else f"torch-{d}")
def device(request):
    """Every pool test runs on the numpy backend and, where torch is installed, on torch CPU."""
    return request.param


os.environ.setdefault("MPLBACKEND", "Agg")
