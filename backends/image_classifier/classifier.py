"""A transformers image-classification model run once over the images of many requests.

Two runtimes compute the same logits: ONNX Runtime over `model.onnx` (exported and checked against
torch by `make model`; no torch import in the stub) and torch over the transformers folder.
`make_classifier` picks one from the model's `runtime` parameter."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from stage_common.gpu_placement import GpuPlacement
from stage_common.onnx_runtime import onnx_session

ONNX_FILE = "model.onnx"
Logits = Callable[[np.ndarray], np.ndarray]  # [n, 3, h, w] float32 -> [n, classes] float32


def labels_of(model_dir: Path) -> list[str]:
    """Class names in index order, from the transformers config (read without transformers)."""
    id2label = json.loads((Path(model_dir) / "config.json").read_text())["id2label"]
    return [id2label[str(i)] for i in range(len(id2label))]


def softmax_top1(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index, probability) of the most probable class per row; computed in float64, returned float32."""
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    probabilities = np.exp(shifted)
    probabilities /= probabilities.sum(axis=-1, keepdims=True)
    index = probabilities.argmax(axis=-1)
    return index, probabilities[np.arange(len(index)), index].astype(np.float32)


class ImageClassifier:
    def __init__(self, logits: Logits, labels: list[str]):
        self.logits, self.labels = logits, labels

    def top1(self, pixel_values: np.ndarray) -> tuple[list[str], np.ndarray]:
        """[n, 3, h, w] -> the most probable label per image and its softmax probability (float32)."""
        index, score = softmax_top1(self.logits(pixel_values))
        return [self.labels[i] for i in index.tolist()], score

    def classify_per_request(self, requests: list[np.ndarray]) -> list[tuple[list[str], np.ndarray]]:
        """One forward per distinct image size (normally one for the whole batch); rows back per request."""
        out: list = [None] * len(requests)
        by_shape: dict[tuple, list[int]] = {}
        for i, pixels in enumerate(requests):
            by_shape.setdefault(pixels.shape[1:], []).append(i)
        for members in by_shape.values():
            try:
                labels, scores = self.top1(np.concatenate([requests[i] for i in members]))
            except Exception as exc:  # noqa: BLE001 - e.g. a size this model cannot take: fails that group only
                for i in members:
                    out[i] = exc
                continue
            row = 0
            for i in members:
                n = len(requests[i])
                out[i] = (labels[row:row + n], scores[row:row + n])
                row += n
        return out


def torch_logits(model_dir: Path, device) -> Logits:
    import torch
    from transformers import AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(str(model_dir)).to(device).eval()

    @torch.inference_mode()
    def logits(pixel_values: np.ndarray) -> np.ndarray:
        return model(pixel_values=torch.from_numpy(pixel_values).to(device)).logits.float().cpu().numpy()

    return logits


def onnx_logits(model_dir: Path, threads: int, gpu: GpuPlacement | None = None) -> Logits:
    session = onnx_session(Path(model_dir) / ONNX_FILE, threads, gpu)

    def logits(pixel_values: np.ndarray) -> np.ndarray:
        return session.run(None, {"pixel_values": np.ascontiguousarray(pixel_values, dtype=np.float32)})[0]

    return logits


def make_classifier(model_dir: Path, runtime: str, threads: int, gpu: GpuPlacement | None = None) -> ImageClassifier:
    """runtime "onnx" (model.onnx, ONNX Runtime) or "torch" (the transformers folder); `gpu` set when
    Triton placed the instance on a GPU."""
    if runtime == "onnx":
        logits = onnx_logits(model_dir, threads, gpu)
    elif runtime == "torch":
        from stage_common.torch_runtime import torch_device

        logits = torch_logits(model_dir, torch_device(threads, gpu))
    else:
        raise ValueError(f"runtime must be 'onnx' or 'torch', not {runtime!r}")
    return ImageClassifier(logits, labels_of(model_dir))
