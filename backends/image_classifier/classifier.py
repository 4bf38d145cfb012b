"""A transformers image-classification model run once over the images of many requests."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForImageClassification


class ImageClassifier:
    def __init__(self, model_dir: Path, device: torch.device):
        self.device = device
        self.model = AutoModelForImageClassification.from_pretrained(str(model_dir)).to(device).eval()
        self.labels = [self.model.config.id2label[i] for i in range(self.model.config.num_labels)]

    @torch.inference_mode()
    def top1(self, pixel_values: np.ndarray) -> tuple[list[str], np.ndarray]:
        """[n, 3, h, w] -> the most probable label per image and its softmax probability (float32)."""
        logits = self.model(pixel_values=torch.from_numpy(pixel_values).to(self.device)).logits
        score, index = logits.float().softmax(dim=-1).max(dim=-1)
        return [self.labels[i] for i in index.tolist()], score.cpu().numpy().astype(np.float32)

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
