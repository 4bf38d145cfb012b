"""CLIP's towers over ONNX Runtime: text.onnx (input_ids, attention_mask -> text_embeds) and image.onnx
(pixel_values -> image_embeds), exported and checked against torch by gateway/modelgen/onnx_export.py `export_clip`.
Imports neither torch nor transformers."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from stage_common.gpu_placement import GpuPlacement
from stage_common.onnx_runtime import onnx_session


class OnnxClip:
    def __init__(self, model_dir: Path, threads: int, gpu: GpuPlacement | None = None):
        model_dir = Path(model_dir)
        missing = [name for name in ("text.onnx", "image.onnx") if not (model_dir / name).is_file()]
        if missing:
            raise FileNotFoundError(f"runtime 'onnx' needs {' and '.join(missing)} in {model_dir} (exported when "
                                    "the gateway registers the model); runtime 'torch' runs without them")
        self.text = onnx_session(model_dir / "text.onnx", threads, gpu)
        self.image = onnx_session(model_dir / "image.onnx", threads, gpu)
        dimension = self.text.get_outputs()[0].shape[-1]
        shape = self.image.get_inputs()[0].shape[1:]
        if not isinstance(dimension, int) or not all(isinstance(d, int) for d in shape):
            config = json.loads((model_dir / "config.json").read_text())
            size = int(config.get("vision_config", {}).get("image_size", 224))
            dimension, shape = int(config.get("projection_dim", 512)), (3, size, size)
        self.dimension, self.image_shape = dimension, tuple(shape)

    def text_features(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return self.text.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})[0]

    def image_features(self, pixel_values: np.ndarray) -> np.ndarray:
        return self.image.run(None, {"pixel_values": np.ascontiguousarray(pixel_values, np.float32)})[0]
