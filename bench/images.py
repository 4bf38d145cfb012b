"""Photo-like test images made with Pillow on the fly (no binary fixtures): the image workload of the benches
(bench/workload.py's food_captioning request) and of the tests (tests/food_images.py builds its hostile and
odd-format images on these)."""
from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A smooth gradient with a coloured blob and some noise: exercises resampling like a photo."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1),
                     np.full_like(x, int(rng.integers(0, 256)))], axis=-1)
    noisy = np.clip(base + rng.integers(-20, 21, base.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(noisy, "RGB")
    colour = tuple(int(v) for v in rng.integers(0, 256, 3))
    ImageDraw.Draw(image).ellipse((width // 4, height // 4, width * 3 // 4, height * 3 // 4), fill=colour)
    return image


def encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()
