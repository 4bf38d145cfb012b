"""The demo CLIP that `make model` trains (build/train_clip.py) on scenes: text queries rank held-out
scenes with the named shape first, and a crop or JPEG copy of a scene finds its original."""
from __future__ import annotations

import pytest

from model_configs import ROOT

PRECISION_AT_5_MIN = 0.35  # chance is ~0.1; measured figures in docs/demo-models.md
CROP_TOP3_MIN, JPEG_TOP1_MIN = 0.85, 0.95


@pytest.fixture(scope="module")
def clip():
    import torch
    from transformers import CLIPImageProcessor, CLIPModel, CLIPTokenizerFast

    torch.set_num_threads(1)
    folder = ROOT / "demo_models" / "clip-demo"
    return (CLIPModel.from_pretrained(folder).eval(), CLIPTokenizerFast.from_pretrained(folder),
            CLIPImageProcessor.from_pretrained(folder))


def test_text_query_precision_at_5(clip):
    from build.train_clip import text_precision_at_5

    precision = text_precision_at_5(*clip)
    print("text -> image precision@5", precision)
    assert precision >= PRECISION_AT_5_MIN


def test_crop_and_jpeg_copies_find_their_original(clip):
    from build.train_clip import self_retrieval

    model, _, processor = clip
    crop, jpeg = self_retrieval(model, processor, "crop"), self_retrieval(model, processor, "jpeg")
    print("crop", crop, "jpeg", jpeg)
    assert crop["top3"] >= CROP_TOP3_MIN, crop
    assert jpeg["top1"] >= JPEG_TOP1_MIN, jpeg
