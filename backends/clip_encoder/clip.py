"""Both towers of a transformers CLIPModel in one process: text rows and images from many requests,
each modality in one forward, giving the projected features (what get_text/image_features return)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import CLIPModel

from transformer_encoder.encoder import pad_together


@dataclass
class TextRows:
    input_ids: np.ndarray  # [rows, len], right-padded
    attention_mask: np.ndarray


@dataclass
class ImageRows:
    pixel_values: np.ndarray  # [rows, 3, H, W]


class ClipTowers:
    def __init__(self, model_dir: Path, device: torch.device):
        self.device = device
        self.model = CLIPModel.from_pretrained(str(model_dir)).to(device).eval()
        self.dimension = self.model.config.projection_dim

    @torch.inference_mode()
    def text_features(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        out = self.model.get_text_features(input_ids=torch.from_numpy(input_ids).to(self.device),
                                           attention_mask=torch.from_numpy(attention_mask).to(self.device))
        return out.float().cpu().numpy()

    @torch.inference_mode()
    def image_features(self, pixel_values: np.ndarray) -> np.ndarray:
        out = self.model.get_image_features(pixel_values=torch.from_numpy(pixel_values).to(self.device))
        return out.float().cpu().numpy()

    def encode_per_request(self, requests: list[TextRows | ImageRows]) -> list[np.ndarray]:
        """[rows_i, dimension] per request: the text rows of all requests padded into one forward, the
        images of all requests stacked into another. A row's result does not depend on its batch-mates
        (padding is masked; CLIP's text pooling takes each row's first end-of-text token)."""
        results: list[np.ndarray | None] = [None] * len(requests)
        texts = [(i, r) for i, r in enumerate(requests) if isinstance(r, TextRows)]
        images = [(i, r) for i, r in enumerate(requests) if isinstance(r, ImageRows)]
        if texts:
            ids = pad_together([r.input_ids for _, r in texts])
            mask = pad_together([r.attention_mask for _, r in texts])
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
