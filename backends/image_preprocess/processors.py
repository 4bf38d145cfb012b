"""The numbers of Hugging Face's slow image processors (BLIP, ViT, ConvNeXt/ResNet, MobileNet, CLIP), computed
with Pillow and numpy in the same order and dtypes, so no torch is needed in this stage."""
from __future__ import annotations

import json
from math import ceil
from pathlib import Path

import numpy as np
from PIL import Image

from stage_common.errors import BadInput

FIXED_SIZE = {"BlipImageProcessor", "ViTImageProcessor"}
SHORTEST_EDGE_CROP_PCT = {"ConvNextImageProcessor"}
SHORTEST_EDGE_THEN_CROP = {"MobileNetV1ImageProcessor", "MobileNetV2ImageProcessor", "CLIPImageProcessor"}
SUPPORTED = FIXED_SIZE | SHORTEST_EDGE_CROP_PCT | SHORTEST_EDGE_THEN_CROP


def keep_ratio_size(height: int, width: int, short_side: int) -> tuple[int, int]:
    """transformers' get_resize_output_image_size(default_to_square=False, max_size=None)."""
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = short_side, int(short_side * long / short)
    return (new_long, new_short) if width <= height else (new_short, new_long)


def center_crop(image: np.ndarray, crop_height: int, crop_width: int) -> np.ndarray:
    """transformers' center_crop on an HWC array, zero-padding an image smaller than the crop."""
    height, width = image.shape[:2]
    top, left = (height - crop_height) // 2, (width - crop_width) // 2
    if top >= 0 and left >= 0:
        return image[top:top + crop_height, left:left + crop_width]
    new_height, new_width = max(crop_height, height), max(crop_width, width)
    padded = np.zeros((new_height, new_width) + image.shape[2:], dtype=image.dtype)
    top_pad, left_pad = ceil((new_height - height) / 2), ceil((new_width - width) / 2)
    padded[top_pad:top_pad + height, left_pad:left_pad + width] = image
    top, left = top + top_pad, left + left_pad
    return padded[max(0, top):min(new_height, top + crop_height), max(0, left):min(new_width, left + crop_width)]


class ImageProcessor:
    """One preprocessor_config.json applied to a decoded RGB image -> float32 [3, H, W]."""

    def __init__(self, config: dict, max_pixels: int):
        kind = config.get("image_processor_type", "")
        if kind not in SUPPORTED:
            raise ValueError(f"image processor {kind!r} is not reproduced here; supported: {sorted(SUPPORTED)}")
        self.kind, self.config, self.max_pixels = kind, config, max_pixels
        self.do_resize, self.size = config["do_resize"], config["size"]
        self.resample = Image.Resampling(config["resample"])
        self.do_rescale, self.rescale_factor = config["do_rescale"], config["rescale_factor"]
        self.do_normalize = config["do_normalize"]
        self.mean = np.array(config["image_mean"], dtype=np.float32)
        self.std = np.array(config["image_std"], dtype=np.float32)
        self.crop = None
        if kind in SHORTEST_EDGE_CROP_PCT and self.size["shortest_edge"] < 384:
            self.crop = (self.size["shortest_edge"],) * 2
        elif kind in SHORTEST_EDGE_THEN_CROP and config.get("do_center_crop"):
            self.crop = (config["crop_size"]["height"], config["crop_size"]["width"])
        if self.output_hw(1000, 1333) != self.output_hw(777, 512):
            raise ValueError(f"{kind} {self.size}: outputs of different sizes cannot be batched")

    @classmethod
    def from_file(cls, path: Path, max_pixels: int) -> "ImageProcessor":
        return cls(json.loads(Path(path).read_text()), max_pixels)

    def resize_hw(self, height: int, width: int) -> tuple[int, int]:
        if not self.do_resize:
            return height, width
        size = self.size
        if self.kind in SHORTEST_EDGE_CROP_PCT:
            edge = size["shortest_edge"]
            if edge < 384:
                return keep_ratio_size(height, width, int(edge / self.config["crop_pct"]))
            return edge, edge
        if "shortest_edge" in size:
            return keep_ratio_size(height, width, size["shortest_edge"])
        return size["height"], size["width"]

    def output_hw(self, height: int, width: int) -> tuple[int, int]:
        return self.crop or self.resize_hw(height, width)

    def __call__(self, image: Image.Image) -> np.ndarray:
        height, width = self.resize_hw(image.height, image.width)
        if height * width > self.max_pixels or min(height, width) < 1:
            raise BadInput(f"a {image.width}x{image.height} image would be resized to {width}x{height}: "
                           "its aspect ratio is too extreme")
        if self.do_resize:
            image = image.resize((width, height), resample=self.resample)
        pixels = np.asarray(image)
        if self.crop:
            pixels = center_crop(pixels, *self.crop)
        if self.do_rescale:
            pixels = (pixels.astype(np.float64) * self.rescale_factor).astype(np.float32)
        else:
            pixels = pixels.astype(np.float32)
        if self.do_normalize:
            pixels = (pixels - self.mean) / self.std
        return np.ascontiguousarray(pixels.transpose(2, 0, 1))
