"""Device and thread settings for the stages that run torch (imported only by those)."""
from __future__ import annotations

import torch

from stage_common.gpu_placement import GpuPlacement, cuda_driver_device_count, device_id_problem
from stage_common.params import config_param


def torch_cuda_problem(device_id: int) -> str | None:
    """What this torch lacks to run on GPU `device_id` (None: nothing)."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        visible = cuda_driver_device_count()
        if visible:  # the driver shows GPUs that torch cannot initialize
            return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) cannot initialize CUDA although the driver "
                    f"shows {visible} GPU(s): is the driver older than CUDA {torch.version.cuda} needs?")
        return device_id_problem(device_id, visible, f"torch {torch.__version__} (CUDA {torch.version.cuda})")
    return device_id_problem(device_id, torch.cuda.device_count(), f"torch {torch.__version__}")


def torch_device(threads: int, gpu: GpuPlacement | None = None) -> torch.device:
    """For a stage whose runtime is chosen by parameter: `threads` torch threads, and the GPU Triton placed the
    instance on when torch can use it (else GpuPlacement refuses to load, or falls back to the CPU when allowed)."""
    torch.set_num_threads(max(1, threads))
    device = gpu.usable("torch", torch_cuda_problem) if gpu is not None else None
    return torch.device(f"cuda:{device}" if device is not None else "cpu")


def configure_torch(args: dict, model_config: dict) -> torch.device:
    """For a stage that always runs torch (the generator's torch engine): the `torch_threads` parameter, one
    inter-op thread, and the device as torch_device gives it for Triton's placement of this instance."""
    from stage_common.triton_io import gpu_placement  # the Triton adapter: only a stub's initialize calls this

    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already fixed once in this process
        pass
    return torch_device(config_param(model_config, "torch_threads", int, 1), gpu_placement(args))
