"""Each image decoded once, then turned into the classifier's and the captioner's pixel inputs."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from image_preprocess.decoding import decode_image
from image_preprocess.processors import ImageProcessor


class FoodImagePreprocessor:
    def __init__(self, classifier_config: Path, captioner_config: Path, max_megapixels: float):
        self.max_pixels = int(max_megapixels * 1_000_000)
        self.classifier = ImageProcessor.from_file(classifier_config, self.max_pixels)
        self.captioner = ImageProcessor.from_file(captioner_config, self.max_pixels)

    def __call__(self, images: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """Encoded images -> classifier pixel_values [n, 3, h, w] and captioner pixel_values [n, 3, H, W]."""
        decoded = [decode_image(data, self.max_pixels) for data in images]
        return (np.stack([self.classifier(image) for image in decoded]),
                np.stack([self.captioner(image) for image in decoded]))


class SingleImagePreprocessor:
    """One model's image processor (e.g. CLIP's): encoded images -> pixel_values [n, 3, H, W]."""

    def __init__(self, processor_config: Path, max_megapixels: float):
        self.max_pixels = int(max_megapixels * 1_000_000)
        self.processor = ImageProcessor.from_file(processor_config, self.max_pixels)

    def __call__(self, images: list[bytes]) -> np.ndarray:
        return np.stack([self.processor(decode_image(data, self.max_pixels)) for data in images])
