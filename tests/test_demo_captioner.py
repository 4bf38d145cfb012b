"""The demo BLIP captioner that `make model` trains (build/train_blip.py) on scenes: whatever Food-11
label the prompt holds, the words after it name the colour and shape of a held-out single-shape scene."""
from __future__ import annotations

from model_configs import MODEL_REPOSITORY

CAPTION_SHARE_MIN = 0.3  # colour and shape both right: well above chance, although shapes are what it learns least
COLOUR_SHARE_MIN = 0.8  # the colour alone


def test_captions_name_colour_and_shape_of_held_out_scenes():
    import torch
    from transformers import BlipForConditionalGeneration, BlipProcessor

    from build.train_blip import caption_share

    torch.set_num_threads(1)
    folder = MODEL_REPOSITORY / "food_captioning_captioner" / "1"
    model = BlipForConditionalGeneration.from_pretrained(folder).eval()
    share, texts = caption_share(model, BlipProcessor.from_pretrained(folder, use_fast=False))
    print(f"share naming colour and shape: {share:.2f}\n" + "\n".join(texts[:5]))
    colour_right = 0
    for text in texts:  # "<prompt> | <words after it> | truth: a <colour> <shape> on a <colour> background"
        _, words, truth = text.split(" | ")
        colour_right += words.startswith(f"a {truth.split()[2]} ")
    print(f"share naming the colour: {colour_right / len(texts):.2f}")
    assert share >= CAPTION_SHARE_MIN
    assert colour_right / len(texts) >= COLOUR_SHARE_MIN
