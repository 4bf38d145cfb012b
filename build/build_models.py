"""`make model`: build every pipeline's artifacts into model_repository/<model>/1/.

MODEL_PROFILE=demo (default) works offline; MODEL_PROFILE=hub fetches the real weights.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from build import instruction_set  # noqa: E402
from build.common import PROFILES, RETRAIN_ENV, trained, use_repository  # noqa: E402

PIPELINES = ["text_embedding", "ner", "codegen", "food_captioning", "embedding_demo"]
# The demo models each pipeline trains (build/train_*.py), longest first.
TRAINED_BY = {"ner": ["train_ner"], "codegen": ["train_codegen"], "embedding_demo": ["train_clip"],
              "food_captioning": ["train_blip", "train_food"]}
TRAIN_WORKERS = 2  # one torch thread each: byte-identical results, both cores busy


def _train_one(module_name: str) -> str:
    module = importlib.import_module(f"build.{module_name}")
    trained(module.NAME, module.train, module.SOURCES)
    return module.NAME


def train_demo_models(pipelines: list[str]) -> None:
    """Train (or find trained) the demo models of `pipelines` up front, TRAIN_WORKERS at a time, each in a
    process of its own on one thread; the pipelines' builders then find them trained and only export."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from build.common import trained_is_current

    random_codegen = os.environ.get("CODEGEN_DEMO_SIZE", "small") != "small"  # the 350m shape stays random
    modules = [m for p in pipelines for m in TRAINED_BY.get(p, []) if not (random_codegen and m == "train_codegen")]
    stale = [m for m in modules if not trained_is_current(importlib.import_module(f"build.{m}"))]
    if not stale:
        return
    print(f"make model: training {', '.join(stale)} ({TRAIN_WORKERS} at a time, one thread each)", flush=True)
    with ProcessPoolExecutor(min(TRAIN_WORKERS, len(stale)), mp_context=get_context("spawn")) as pool:
        for name in pool.map(_train_one, stale):
            print(f"make model: {name} trained", flush=True)
    os.environ.pop(RETRAIN_ENV, None)  # done: the builders below reuse what was just trained


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", default=os.environ.get("MODEL_PROFILE", "demo"), choices=PROFILES)
    parser.add_argument("--repository", type=Path, help="build into this folder instead of model_repository/")
    parser.add_argument("pipelines", nargs="*", default=PIPELINES, help=f"any of {PIPELINES}")
    args = parser.parse_args()
    instruction_set.pin()  # before anything imports torch; the training workers inherit it
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.profile == "demo":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.repository:
        use_repository(args.repository)
    start = time.monotonic()
    for name in args.pipelines:
        if name not in PIPELINES:
            parser.error(f"unknown pipeline {name!r}; choose from {PIPELINES}")
    if args.profile == "demo":
        train_demo_models(args.pipelines)
    for name in args.pipelines:
        importlib.import_module(f"build.{name}").build(args.profile)
    print(f"make model: {len(args.pipelines)} pipeline(s), profile {args.profile}, into "
          f"{args.repository or 'model_repository'}/, {time.monotonic() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
