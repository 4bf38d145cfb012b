"""What the gpu tests share: the skip where no GPU is visible, the demo models' folders, GPU placements as
Triton would give them, and the report of where greedy tokens part between the CPU and the GPU."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from stage_common.gpu_placement import GpuPlacement

ROOT = Path(__file__).resolve().parents[2]
MODEL_REPOSITORY = ROOT / "model_repository"
CLIP_DIR = ROOT / "demo_models" / "clip-demo"
CUDA = torch.device("cuda:0")
EMBEDDING_TOLERANCE = 1e-3  # embeddings and CLIP features, L2-normalized, CPU against GPU
LOGIT_TOLERANCE = 5e-3  # of the largest logit: CPU-GPU differences up to this are kernel noise

# each test module's pytestmark
GPU_TIER = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason=f"no GPU visible: torch.cuda.is_available() is false (torch {torch.__version__})")]


def model_dir(model: str, *needed: str) -> Path:
    """model_repository/<model>/1, skipping the test when `make model` (or gpu_check's carry) left it unbuilt."""
    folder = MODEL_REPOSITORY / model / "1"
    missing = [name for name in needed if not (folder / name).exists()]
    if missing:
        pytest.skip(f"{folder} lacks {', '.join(missing)}: run `make model` (tools/gpu_check.sh installs the carry)")
    return folder


def on_gpu(stage: str) -> GpuPlacement:
    """GPU 0 as Triton's KIND_GPU instance would give it: a runtime that cannot use it refuses (no fallback)."""
    return GpuPlacement(stage, 0)


def onnx_on_gpu_or_skip(folder: Path, *files: str) -> None:
    """The ONNX Runtime variant needs onnxruntime-gpu and the exported graphs."""
    import onnxruntime

    missing = [name for name in files if not (folder / name).is_file()]
    if missing:
        pytest.skip(f"{folder} lacks {', '.join(missing)} (the ONNX export): runtime onnx not checked")
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip(f"onnxruntime {onnxruntime.__version__} has no CUDAExecutionProvider (install onnxruntime-gpu: "
                    "make setup GPU=1)")


def max_difference(cpu: np.ndarray, gpu: np.ndarray) -> float:
    assert cpu.shape == gpu.shape, (cpu.shape, gpu.shape)
    return float(np.abs(cpu.astype(np.float64) - gpu.astype(np.float64)).max(initial=0.0))


def normalized(rows: np.ndarray) -> np.ndarray:
    return rows / np.maximum(np.linalg.norm(rows, axis=-1, keepdims=True), 1e-12)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (one ending early counts), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def divergence(position: int, cpu_ids: list[int], gpu_ids: list[int], cpu_logits: np.ndarray,
               gpu_logits: np.ndarray) -> tuple[bool, str]:
    """(near tie, report) for greedy tokens that part at `position`: the logits each device gave there for the
    CPU's token and the GPU's, and their top 3. Where the argmax flips, the two tokens' gaps on the two devices
    add up to at most twice the largest CPU-GPU logit difference, so a flip is kernel noise (a near tie) exactly
    when that difference is small: at most LOGIT_TOLERANCE of the largest logit."""
    a = cpu_ids[position] if position < len(cpu_ids) else None
    b = gpu_ids[position] if position < len(gpu_ids) else None
    noise = max_difference(cpu_logits, gpu_logits)
    bound = LOGIT_TOLERANCE * max(1.0, float(np.abs(cpu_logits).max(initial=0.0)))

    def top(logits: np.ndarray) -> str:
        return ", ".join(f"{i}:{logits[i]:.6f}" for i in np.argsort(-logits)[:3])

    report = (f"tokens part at position {position}: cpu {a}, gpu {b}; largest logit difference there {noise:.2e} "
              f"(noise bound {bound:.2e}); cpu logits [{a}]={_at(cpu_logits, a)} [{b}]={_at(cpu_logits, b)} "
              f"top {top(cpu_logits)}; gpu logits [{a}]={_at(gpu_logits, a)} [{b}]={_at(gpu_logits, b)} "
              f"top {top(gpu_logits)}")
    return noise <= bound, report


def _at(logits: np.ndarray, token: int | None) -> str:
    return "-" if token is None else f"{logits[token]:.6f}"


def check_tokens(name: str, cpu_ids: list[int], gpu_ids: list[int], logits_at) -> None:
    """Equal tokens pass. Where they part, `logits_at(position) -> (cpu_logits, gpu_logits)` of the common
    prefix: a near tie passes with the report as a warning (kernels may order a tie either way), else fail."""
    import warnings

    position = first_difference(cpu_ids, gpu_ids)
    if position is None:
        return
    near_tie, report = divergence(position, cpu_ids, gpu_ids, *logits_at(position))
    if not near_tie:
        pytest.fail(f"{name}: {report}")
    warnings.warn(f"{name}: a near tie, {report}")
