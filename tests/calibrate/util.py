"""Build a model/GPU/server-args triple, generate a small trace and load it the way the CLI does."""


def server(model_name, gpu_name, **flags):
    from poolsim.pools.hardware.gpu_catalog import get_gpu
    from poolsim.pools.model.config import ModelConfig
    from poolsim.pools.sizing.server_args import ServerArgs

    return ModelConfig.load(model_name), get_gpu(gpu_name), ServerArgs(**flags)


def load(path):
    from poolsim.traces import load_trace

    return load_trace(path)


def generate_trace(path, *args):
    """``poolsim trace generate PATH ARGS...`` through the CLI; returns ``path``."""
    from typer.testing import CliRunner

    from poolsim.cli import app

    res = CliRunner().invoke(app, ["trace", "generate", str(path), *args])
    assert res.exit_code == 0, res.output
    return path
