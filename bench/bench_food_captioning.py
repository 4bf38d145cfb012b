"""food_captioning: served images/s at concurrency 1, 8, 16 vs the same stage code in-process."""
from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bench.model_repo import MODEL_REPOSITORY, parameter
from bench.perf import best_limit, run_load, text_inputs_factory

MODELS = ["food_captioning"]


def photos(n: int = 32, seed: int = 0) -> list[bytes]:
    """JPEGs of web-photo sizes (320 to 1024 px a side), smooth colour fields with noise, identical every run."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        width, height = (int(v) for v in rng.integers(320, 1025, 2))
        y, x = np.mgrid[0:height, 0:width]
        tint = rng.integers(0, 256, 3)
        pixels = np.stack([(x * 255 // width + tint[0]) % 256, (y * 255 // height + tint[1]) % 256,
                           np.full_like(x, tint[2])], axis=-1) + rng.integers(-15, 16, (height, width, 3))
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
        box = sorted(int(v) for v in rng.integers(0, width, 2)) + sorted(int(v) for v in rng.integers(0, height, 2))
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        ImageDraw.Draw(image).ellipse((box[0], box[2], box[1], box[3]), fill=colour)
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=88)
        out.append(buffer.getvalue())
    return out


def stage_code(runtime: str = "onnx", threads: int = 1):
    """preprocess -> classifier -> captioner called directly, as the served stages run them (both networks
    on ONNX Runtime, as shipped, or both on torch), `threads` each."""
    from blip_captioner.captioner import make_captioner
    from image_classifier.classifier import make_classifier
    from image_preprocess.preprocess import FoodImagePreprocessor

    folder = MODEL_REPOSITORY / "food_captioning_preprocess" / "1"
    preprocess = FoodImagePreprocessor(folder / "classifier_preprocessor_config.json",
                                       folder / "blip_preprocessor_config.json",
                                       float(parameter("food_captioning_preprocess", "max_megapixels")))
    classifier = make_classifier(MODEL_REPOSITORY / "food_captioning_classifier" / "1", runtime, threads)
    captioner = make_captioner(MODEL_REPOSITORY / "food_captioning_captioner" / "1", runtime, threads,
                               prompt_template=parameter("food_captioning_captioner", "prompt_template"),
                               max_new_tokens=int(parameter("food_captioning_captioner", "max_new_tokens")),
                               num_beams=int(parameter("food_captioning_captioner", "num_beams")))

    # the served pipeline decodes in two preprocess processes; here `threads` threads share the batch
    # (Pillow's decode and resize release the GIL)
    pool = ThreadPoolExecutor(threads)

    def preprocessed(images: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        step = -(-len(images) // threads)
        parts = list(pool.map(preprocess, [images[i:i + step] for i in range(0, len(images), step)]))
        return np.concatenate([c for c, _ in parts]), np.concatenate([b for _, b in parts])

    def process(images: list[bytes]) -> None:
        classifier_pixels, blip_pixels = preprocessed(images)
        labels, _scores = classifier.top1(classifier_pixels)
        captioner.caption(list(blip_pixels), labels)

    return process


def limit(seconds: float) -> float:
    """The best in-process path, images/s, at batches up to the highest concurrency served (16 clients
    never put more than 16 images in a batch)."""
    return best_limit(stage_code, photos(), (1, 4, 8, 16), seconds, "images/sec")


def run(ctx) -> None:
    images = photos()
    best = limit(max(ctx.window / 4, 1.0))
    for concurrency in ((1, 16) if ctx.quick else (1, 8, 16)):
        result = run_load(ctx.grpc_url, "food_captioning", text_inputs_factory(images, "image"), concurrency,
                          ctx.window, ctx.warmup)
        ctx.report(result, best, "images/sec")
