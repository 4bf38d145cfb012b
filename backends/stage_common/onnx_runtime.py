"""ONNX Runtime sessions for the stages that can run an exported model (no torch import)."""
from __future__ import annotations

from pathlib import Path

from stage_common.gpu_placement import GpuPlacement, cuda_driver_device_count, device_id_problem

CUDA_PROVIDER = "CUDAExecutionProvider"


def onnxruntime_cuda_problem(ort, device_id: int, visible: int | None = None) -> str | None:
    """What ONNX Runtime lacks to run on GPU `device_id` (None: nothing found missing before a session)."""
    if CUDA_PROVIDER not in ort.get_available_providers():
        return (f"onnxruntime {ort.__version__} has no {CUDA_PROVIDER} (this is the CPU build 'onnxruntime'; "
                "the GPU build is the package 'onnxruntime-gpu')")
    return device_id_problem(device_id, cuda_driver_device_count() if visible is None else visible, "the driver")


def onnx_session(path: Path, threads: int, gpu: GpuPlacement | None = None):
    """An ONNX Runtime session with a fixed intra-op thread count; on the GPU `gpu` holds when ONNX Runtime can use
    it (else GpuPlacement refuses to load, or falls back to the CPU when allowed)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # idle pool threads must not spin: other instances and stages need the cores between executions
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    providers: list = ["CPUExecutionProvider"]
    device = gpu.usable("onnxruntime", lambda d: onnxruntime_cuda_problem(ort, d)) if gpu is not None else None
    if device is not None:
        if hasattr(ort, "preload_dlls"):  # CUDA/cuDNN from the nvidia-* wheels, when they are installed
            ort.preload_dlls()
        providers.insert(0, (CUDA_PROVIDER, {"device_id": device}))
    session = ort.InferenceSession(str(path), options, providers=providers)
    # A CUDA provider that fails to start (CUDA or cuDNN libraries missing, a bad device) leaves ONNX Runtime on
    # the CPU with only a log line: checked here, so that it is not silent
    if device is not None and CUDA_PROVIDER not in session.get_providers():
        gpu.unusable("onnxruntime", f"{CUDA_PROVIDER} is installed but did not start on GPU {device} (the CUDA or "
                                    "cuDNN libraries it was built for missing? its own error is in the log above)")
    return session
