"""Device and thread settings for the stages that run torch (imported only by those)."""
from __future__ import annotations

import torch

from stage_common.params import config_param


def configure_torch(args: dict, model_config: dict) -> torch.device:
    """Thread count from the `torch_threads` parameter; CUDA when Triton placed this instance on a GPU."""
    torch.set_num_threads(max(1, config_param(model_config, "torch_threads", int, 1)))
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already fixed once in this process
        pass
    if args.get("model_instance_kind") == "GPU" and torch.cuda.is_available():
        return torch.device(f"cuda:{args.get('model_instance_device_id', 0)}")
    return torch.device("cpu")


def torch_device(threads: int, gpu_device: int | None = None) -> torch.device:
    """For a stage whose runtime is chosen by parameter: `threads` torch threads, and the GPU Triton
    placed the instance on (None: CPU)."""
    torch.set_num_threads(max(1, threads))
    return torch.device(f"cuda:{gpu_device}" if gpu_device is not None and torch.cuda.is_available() else "cpu")
