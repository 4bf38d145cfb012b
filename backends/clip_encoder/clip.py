"""Both towers of a CLIP model in one process: text rows and images from many requests, each modality in
one forward, giving the projected features (what CLIPModel.get_text/image_features return).

Two runtimes compute the same features: ONNX Runtime over text.onnx and image.onnx (onnx_clip.py; exported
and checked against torch when the gateway registers the model, gateway/modelgen/onnx_export.py `export_clip`; no
torch or transformers in the stub) and torch over the transformers folder (torch_clip.py).
`make_towers` picks one from the model's `runtime` parameter. Imports neither torch nor transformers."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from stage_common.gpu_placement import GpuPlacement
from stage_common.padding import pad_together

ONNX_FILES = ("text.onnx", "image.onnx")


@dataclass
class TextRows:
    input_ids: np.ndarray  # [rows, len], right-padded
    attention_mask: np.ndarray


@dataclass
class ImageRows:
    pixel_values: np.ndarray  # [rows, 3, H, W]


class Towers(Protocol):
    dimension: int
    image_shape: tuple[int, int, int]  # (3, H, W) the vision tower takes

    def text_features(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray: ...

    def image_features(self, pixel_values: np.ndarray) -> np.ndarray: ...


class ClipTowers:
    def __init__(self, towers: Towers):
        self.towers = towers
        self.dimension, self.image_shape = towers.dimension, tuple(towers.image_shape)

    def text_features(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return self.towers.text_features(input_ids, attention_mask)

    def image_features(self, pixel_values: np.ndarray) -> np.ndarray:
        return self.towers.image_features(pixel_values)

    def encode_per_request(self, requests: list[TextRows | ImageRows]) -> list[np.ndarray]:
        """[rows_i, dimension] per request: the text rows of all requests padded into one forward, the
        images of all requests stacked into another. A row's result does not depend on its batch-mates
        (padding is masked; CLIP's text pooling takes each row's first end-of-text token)."""
        results: list[np.ndarray | None] = [None] * len(requests)
        texts = [(i, r) for i, r in enumerate(requests) if isinstance(r, TextRows)]
        images = [(i, r) for i, r in enumerate(requests) if isinstance(r, ImageRows)]
        if texts:
            ids = pad_together([r.input_ids.astype(np.int64, copy=False) for _, r in texts])
            mask = pad_together([r.attention_mask.astype(np.int64, copy=False) for _, r in texts])
            self._scatter(self.text_features(ids, mask), texts, results)
        if images:
            pixels = np.concatenate([r.pixel_values for _, r in images]).astype(np.float32, copy=False)
            self._scatter(self.image_features(pixels), images, results)
        return results

    @staticmethod
    def _scatter(features: np.ndarray, items: list, results: list) -> None:
        row = 0
        for i, request in items:
            n = (request.input_ids if isinstance(request, TextRows) else request.pixel_values).shape[0]
            results[i] = features[row:row + n]
            row += n


def text_token_bounds(model_dir: Path) -> tuple[int, int]:
    """(vocabulary size, position embeddings) of the text tower, with transformers' CLIPTextConfig defaults
    (49408, 77) where config.json leaves them out: beyond either the text forward raises for every row."""
    import json

    text = json.loads((Path(model_dir) / "config.json").read_text()).get("text_config", {})
    return int(text.get("vocab_size", 49408)), int(text.get("max_position_embeddings", 77))


def has_onnx(model_dir: Path) -> bool:
    """Whether the model's folder holds the exported towers (the gateway links them in at registration)."""
    return all((Path(model_dir) / name).is_file() for name in ONNX_FILES)


def make_towers(model_dir: Path, runtime: str, threads: int, gpu: GpuPlacement | None = None) -> ClipTowers:
    """runtime "onnx" (text.onnx + image.onnx, ONNX Runtime) or "torch" (the transformers CLIPModel folder);
    `gpu` set when Triton placed the instance on a GPU (the runtime must be able to use it)."""
    if runtime == "onnx":
        from clip_encoder.onnx_clip import OnnxClip

        return ClipTowers(OnnxClip(model_dir, threads, gpu))
    if runtime == "torch":
        from clip_encoder.torch_clip import TorchClip
        from stage_common.torch_runtime import torch_device

        return ClipTowers(TorchClip(model_dir, torch_device(threads, gpu)))
    raise ValueError(f"runtime must be 'onnx' or 'torch', not {runtime!r}")
