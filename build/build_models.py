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

from build.common import PROFILES, use_repository  # noqa: E402

PIPELINES = ["text_embedding", "ner", "codegen", "food_captioning", "embedding_demo"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", default=os.environ.get("MODEL_PROFILE", "demo"), choices=PROFILES)
    parser.add_argument("--repository", type=Path, help="build into this folder instead of model_repository/")
    parser.add_argument("pipelines", nargs="*", default=PIPELINES, help=f"any of {PIPELINES}")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.profile == "demo":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.repository:
        use_repository(args.repository)
    start = time.monotonic()
    for name in args.pipelines:
        if name not in PIPELINES:
            parser.error(f"unknown pipeline {name!r}; choose from {PIPELINES}")
        importlib.import_module(f"build.{name}").build(args.profile)
    print(f"make model: {len(args.pipelines)} pipeline(s), profile {args.profile}, into "
          f"{args.repository or 'model_repository'}/, {time.monotonic() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
