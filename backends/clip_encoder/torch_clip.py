"""CLIP's towers through transformers (torch): the reference the ONNX path reproduces."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import CLIPModel


class TorchClip:
    def __init__(self, model_dir: Path, device: torch.device):
        self.device = device
        self.model = CLIPModel.from_pretrained(str(model_dir)).to(device).eval()
        self.dimension = self.model.config.projection_dim
        size = self.model.config.vision_config.image_size
        self.image_shape = (3, size, size)

    @torch.inference_mode()
    def text_features(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        out = self.model.get_text_features(input_ids=torch.from_numpy(input_ids).to(self.device),
                                           attention_mask=torch.from_numpy(attention_mask).to(self.device))
        return out.float().cpu().numpy()

    @torch.inference_mode()
    def image_features(self, pixel_values: np.ndarray) -> np.ndarray:
        out = self.model.get_image_features(pixel_values=torch.from_numpy(pixel_values).to(self.device))
        return out.float().cpu().numpy()
