"""ONNX Runtime sessions for the stages that can run an exported model (no torch import)."""
from __future__ import annotations

from pathlib import Path


def onnx_session(path: Path, threads: int, use_cuda: bool = False, device_id: int = 0):
    """An ONNX Runtime session with a fixed intra-op thread count (CUDA provider when asked and present)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # idle pool threads must not spin: other instances and stages need the cores between executions
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    providers = ["CPUExecutionProvider"]
    if use_cuda and "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, ("CUDAExecutionProvider", {"device_id": device_id}))
    return ort.InferenceSession(str(path), options, providers=providers)
