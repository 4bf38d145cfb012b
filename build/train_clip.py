"""Train the demo CLIP (demo_models/clip-demo) contrastively on scenes (build/scenes.py) and their
captions. Each training picture is drawn a little larger and cropped back by up to 15% at a random
place, some through JPEG, so a crop or a JPEG copy of a picture lands next to the original."""
from __future__ import annotations

import io
from pathlib import Path

from build.common import seed_everything
from build.training import train_steps, warmup_then_linear

SEED = 20261123
TRAIN_SEED, HELD_OUT_SEED = 31, 32  # scene seeds
POOL, STEPS, BATCH, LR = 3000, 800, 96, 2e-3
NAME = "clip-demo"  # .artifacts/trained/<NAME>/
SOURCES = [Path(__file__), Path(__file__).with_name("scenes.py"), Path(__file__).with_name("embedding_demo.py"),
           Path(__file__).with_name("training.py")]


def augmented(image, rng, size: int):
    """A random crop keeping 90-100% of each side, resized back, and a JPEG round trip half the time."""
    from PIL import Image

    keep = float(rng.uniform(0.85, 1.0))
    side = image.width * keep
    left, top = (float(v) for v in rng.uniform(0, image.width - side, 2))
    image = image.resize((size, size), Image.BICUBIC, box=(left, top, left + side, top + side))
    if rng.random() < 0.5:
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=int(rng.integers(60, 95)))
        image = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")
    return image


def pixel_values(processor, images):
    return processor(images=images, return_tensors="pt").pixel_values


def train(dest: Path, pool: int = POOL, steps: int = STEPS) -> None:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from build.embedding_demo import CLIP_IMAGE_SIZE, untrained_clip
    from build.scenes import MAX_SHAPES, scenes

    model, tokenizer, processor = untrained_clip()
    rng = np.random.default_rng(TRAIN_SEED)
    drawn = scenes(TRAIN_SEED, pool)
    images = [augmented(s.render(CLIP_IMAGE_SIZE + 8, jitter=12, rng=rng), rng, CLIP_IMAGE_SIZE) for s in drawn]
    pixels = pixel_values(processor, images)
    # Half of the texts are the whole caption, half one shape's phrase ("a red circle"): what a search
    # query looks like.
    variants = [[s.caption()] + [shape.phrase() for shape in s.shapes] for s in drawn]
    seed_everything(SEED)
    generator = torch.Generator().manual_seed(SEED)

    def batch_loss(step: int):
        idx = torch.randperm(pool, generator=generator)[:BATCH]
        picks = torch.randint(0, 2 * MAX_SHAPES, (len(idx),), generator=generator).tolist()
        texts = [variants[i][0] if pick < MAX_SHAPES else variants[i][1 + pick % (len(variants[i]) - 1)]
                 for i, pick in zip(idx.tolist(), picks)]
        text = tokenizer(texts, padding=True, return_tensors="pt")
        out = model(input_ids=text.input_ids, attention_mask=text.attention_mask, pixel_values=pixels[idx])
        target = torch.arange(len(idx))
        return (F.cross_entropy(out.logits_per_image, target) + F.cross_entropy(out.logits_per_text, target)) / 2

    train_steps(model, steps, batch_loss, "clip", LR, warmup_then_linear(steps))
    model.save_pretrained(str(dest))
    tokenizer.save_pretrained(str(dest))
    processor.save_pretrained(str(dest))


def embed_images(model, processor, images):
    import torch

    with torch.inference_mode():
        return torch.nn.functional.normalize(model.get_image_features(pixel_values=pixel_values(processor, images)), dim=-1)


def embed_texts(model, tokenizer, texts):
    import torch

    with torch.inference_mode():
        batch = tokenizer(texts, padding=True, return_tensors="pt")
        return torch.nn.functional.normalize(model.get_text_features(**batch), dim=-1)


def text_precision_at_5(model, tokenizer, processor, count: int = 300, seed: int = HELD_OUT_SEED) -> float:
    """Mean over "a <colour> <shape>" queries (those with >= 5 matching held-out scenes) of the share of
    the 5 best-ranked held-out scenes that contain such a shape."""
    from build.embedding_demo import CLIP_IMAGE_SIZE
    from build.scenes import COLOUR_NAMES, SHAPES, scenes

    drawn = scenes(seed, count)
    images = embed_images(model, processor, [s.render(CLIP_IMAGE_SIZE) for s in drawn])
    queries = [(c, k) for c in COLOUR_NAMES for k in SHAPES]
    texts = embed_texts(model, tokenizer, [f"a {c} {k}" for c, k in queries])
    precisions = []
    for (colour, kind), query in zip(queries, texts):
        relevant = [any(s.colour == colour and s.kind == kind for s in scene.shapes) for scene in drawn]
        if sum(relevant) >= 5:
            top = (images @ query).argsort(descending=True)[:5].tolist()
            precisions.append(sum(relevant[i] for i in top) / 5)
    return sum(precisions) / len(precisions)


def self_retrieval(model, processor, kind: str, count: int = 100, seed: int = HELD_OUT_SEED + 1) -> dict:
    """Shares of held-out scenes whose copy (kind "crop": 10% cut off two sides; "jpeg": quality 75)
    ranks its own original first ("top1") and among the first three ("top3") of all originals."""
    from PIL import Image

    from build.scenes import scenes

    originals = [s.render(256) for s in scenes(seed, count)]
    copies = []
    for i, image in enumerate(originals):
        if kind == "crop":
            cut = int(image.width * 0.1)
            box = [(cut, cut, image.width, image.height), (0, 0, image.width - cut, image.height - cut)][i % 2]
            copies.append(image.crop(box))
        else:
            buffer = io.BytesIO()
            image.save(buffer, format="JPEG", quality=75)
            copies.append(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB"))
    a, b = embed_images(model, processor, originals), embed_images(model, processor, copies)
    ranks = [int((row > row[i]).sum()) for i, row in enumerate(b @ a.T)]
    return {"top1": sum(r == 0 for r in ranks) / count, "top3": sum(r < 3 for r in ranks) / count}
