"""Train the demo BLIP captioner (food_captioning_captioner) on scenes (build/scenes.py): the text is
the pipeline's prompt with a random Food-11 label, then the scene's caption, so whatever label the
classifier puts in the prompt, the words after it describe the shapes and colours in the image."""
from __future__ import annotations

from pathlib import Path

from build.common import seed_everything
from build.training import train_steps, warmup_then_linear

SEED = 1234
TRAIN_SEED, HELD_OUT_SEED = 41, 42  # scene seeds
POOL, STEPS, BATCH, LR = 3000, 800, 16, 3e-3
PROMPT = "a photo of {label}"  # the captioner stage's default prompt template
NAME = "captioner"  # .artifacts/trained/<NAME>/
SOURCES = [Path(__file__), Path(__file__).with_name("scenes.py"), Path(__file__).with_name("food_captioning.py"),
           Path(__file__).with_name("training.py")]


def untrained():
    from transformers import BlipForConditionalGeneration

    from build.food_captioning import demo_captioner

    model, processor = demo_captioner()
    # BLIP's own initializer range (the untrained demo widened it to 0.2 so its noise varied per image)
    model.config.vision_config.initializer_range = model.config.text_config.initializer_range = 0.02
    model.config.initializer_range = 0.02
    seed_everything(SEED)
    return BlipForConditionalGeneration(model.config), processor


def train(dest: Path, pool: int = POOL, steps: int = STEPS) -> None:
    import numpy as np
    import torch

    from build.food_captioning import FOOD11_LABELS
    from build.scenes import scenes

    model, processor = untrained()
    size = processor.image_processor.size["height"]
    rng = np.random.default_rng(TRAIN_SEED)
    drawn = scenes(TRAIN_SEED, pool)
    pixels = processor.image_processor(images=[s.render(size, jitter=12, rng=rng) for s in drawn],
                                       return_tensors="pt").pixel_values
    captions = [s.caption() for s in drawn]
    tokenizer = processor.tokenizer
    generator = torch.Generator().manual_seed(SEED)

    def batch_loss(step: int):
        idx = torch.randperm(pool, generator=generator)[:BATCH].tolist()
        labels = torch.randint(0, len(FOOD11_LABELS), (len(idx),), generator=generator).tolist()
        texts = [f"{PROMPT.format(label=FOOD11_LABELS[l])} {captions[i]}".lower() for i, l in zip(idx, labels)]
        batch = tokenizer(texts, padding=True, return_tensors="pt")
        input_ids = batch.input_ids.clone()
        input_ids[:, 0] = tokenizer.bos_token_id  # generation starts from [DEC], as BLIP's generate does
        targets = input_ids.masked_fill(batch.attention_mask == 0, -100)
        return model(pixel_values=pixels[idx], input_ids=input_ids, attention_mask=batch.attention_mask,
                     labels=targets).loss

    train_steps(model, steps, batch_loss, "captioner", LR, warmup_then_linear(steps), clip_norm=1.0)
    model.save_pretrained(dest)
    processor.save_pretrained(dest)


def caption_share(model, processor, count: int = 60, seed: int = HELD_OUT_SEED) -> tuple[float, list[str]]:
    """Share of held-out single-shape scenes whose generated words after the prompt (a random Food-11
    label in it) name the scene's colour and shape ("a red circle")."""
    import numpy as np
    import torch

    from build.food_captioning import FOOD11_LABELS
    from build.scenes import scenes

    rng = np.random.default_rng(seed)
    size = processor.image_processor.size["height"]
    drawn = scenes(seed, count, count=1)
    right, texts = 0, []
    for scene in drawn:
        prompt = PROMPT.format(label=FOOD11_LABELS[int(rng.integers(len(FOOD11_LABELS)))]).lower()
        inputs = processor(images=scene.render(size), text=prompt, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=20)
        words = processor.decode(out[0], skip_special_tokens=True)[len(prompt):]
        right += scene.shapes[0].phrase() in words
        texts.append(f"{prompt} | {words.strip()} | truth: {scene.caption()}")
    return right / count, texts
