"""CLIP towers in-process at ViT-B/32's size: ONNX Runtime against torch, through the clip_encoder
stage's own code (make_towers), and the export the gateway runs when such a model is registered.

The model is transformers' CLIPConfig() default, openai/clip-vit-base-patch32's architecture (text
512 wide x 12 layers, vision 768 x 12, patch 32, 224 px, projection 512), random weights with a fixed
seed (no download here), built once into bench-results/. Texts of 12 tokens; images at 224 px.

    python -m bench.bench_clip [--seconds 3] [--threads 2]
As a `make bench` entry (`bench/suite.py --only clip`) it needs no server.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

MODELS: list[str] = []  # in-process only
MODEL_DIR = ROOT / "bench-results" / "clip-vit-b-32-random"
BATCHES = (1, 16)


def build_model(dest: Path = MODEL_DIR) -> Path:
    """A random CLIPModel of ViT-B/32's architecture (saved once)."""
    if (dest / "config.json").is_file():
        return dest
    import torch
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(0)
    CLIPModel(CLIPConfig()).eval().save_pretrained(str(dest))
    return dest


def export(model_dir: Path) -> tuple[float, dict]:
    """The gateway's export (gateway/modelgen/onnx_export.py export_clip) into model_dir; (seconds, max abs diffs)."""
    from gateway.modelgen.onnx_export import export_clip

    started = time.perf_counter()
    diffs = export_clip(model_dir, model_dir)
    return time.perf_counter() - started, diffs


def rate(call, items: int, seconds: float) -> float:
    """items/s of `call` (one warm-up call first), over at least `seconds`."""
    call()
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        call()
        done += items
    return done / (time.perf_counter() - started)


def measure(model_dir: Path, runtime: str, threads: int, seconds: float) -> dict[str, float]:
    from clip_encoder.clip import ImageRows, TextRows, make_towers

    towers = make_towers(model_dir, runtime, threads)
    rng = np.random.default_rng(0)
    out = {}
    for batch in BATCHES:
        ids = rng.integers(1, 49000, (batch, 12)).astype(np.int64)
        ids[:, -1] = 49407  # end of text
        text = [TextRows(ids, np.ones_like(ids))]
        images = [ImageRows(rng.standard_normal((batch, 3, 224, 224)).astype(np.float32))]
        out[f"text b{batch}"] = rate(lambda: towers.encode_per_request(text), batch, seconds)
        out[f"image b{batch}"] = rate(lambda: towers.encode_per_request(images), batch, seconds)
    return out


def report(seconds: float, threads: int) -> None:
    model_dir = build_model()
    took, diffs = export(model_dir)
    print(f"CLIP ViT-B/32 size (random weights): export of both towers {took:.1f} s, max abs difference to torch "
          f"text {diffs['text']:.1e}, image {diffs['image']:.1e}", flush=True)
    rows = {runtime: measure(model_dir, runtime, threads, seconds) for runtime in ("onnx", "torch")}
    print(f"in-process, {threads} threads, texts of 12 tokens, 224 px images (items/s):")
    print("| runtime | " + " | ".join(rows["onnx"]) + " |")
    print("|---|" + "---|" * len(rows["onnx"]))
    for runtime, values in rows.items():
        print(f"| {runtime} | " + " | ".join(f"{v:.1f}" for v in values.values()) + " |")
    print("| onnx/torch | " + " | ".join(f"{rows['onnx'][k] / rows['torch'][k]:.2f}x" for k in rows["onnx"]) + " |",
          flush=True)


def run(ctx) -> None:
    report(1.0 if ctx.quick else 4.0, 2)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    report(args.seconds, args.threads)
