"""Build a model/GPU/server-args triple and load a trace the way the CLI does."""


def server(model_name, gpu_name, **flags):
    from pools.gpu_catalog import get_gpu
    from pools.model_config import ModelConfig
    from pools.server_args import ServerArgs

    return ModelConfig.load(model_name), get_gpu(gpu_name), ServerArgs(**flags)


def load(path):
    from traces import load_trace

    return load_trace(path)
