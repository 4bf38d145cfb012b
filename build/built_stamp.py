"""Which pipelines of a model repository are built, and with today's build code: `make model` writes a stamp per
pipeline it built (`<repository>/.built/<pipeline>.json`), and `make triton` (launcher/build_behind.py) serves
at once each pipeline whose stamp matches, and builds the others behind the running server.

The stamp's key covers what decides the artifacts beyond the trained models (whose own keys are
build/trained_cache's): the build code (every file of build/), the profile, and the settings that change what
is exported (CODEGEN_DEMO_SIZE, CODEGEN_WEIGHTS). A change to any of them makes every pipeline stale: rebuilt
behind the server, quickly where the machine's caches hold its models (build/model_cache.py).

The launcher asks through the command line (it does not import build/, pyproject.toml's layers):
    python -m build.built_stamp [--profile demo] [--repository DIR]
prints {"pipelines": [...every pipeline, in build order...], "stale": [...those to build...]}."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

from build.common import MODEL_REPOSITORY

PIPELINES = ["text_embedding", "ner", "codegen", "food_captioning", "embedding_demo"]

FOLDER = ".built"  # inside the model repository; Triton's explicit model control never looks at it
SETTINGS = ("CODEGEN_DEMO_SIZE", "CODEGEN_WEIGHTS")


def key(profile: str) -> str:
    h = hashlib.sha256(profile.encode())
    for name in SETTINGS:
        h.update(f"{name}={os.environ.get(name, '')}".encode())
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _path(pipeline: str, folder: Path | None) -> Path:
    return (folder or MODEL_REPOSITORY) / FOLDER / f"{pipeline}.json"


def write(pipeline: str, profile: str, folder: Path | None = None) -> None:
    path = _path(pipeline, folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pipeline": pipeline, "profile": profile, "key": key(profile)}) + "\n")


def is_current(pipeline: str, profile: str, folder: Path | None = None) -> bool:
    try:
        return json.loads(_path(pipeline, folder).read_text()).get("key") == key(profile)
    except (OSError, ValueError):
        return False


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m build.built_stamp", description="which pipelines to build")
    parser.add_argument("--profile", default=os.environ.get("MODEL_PROFILE", "demo"))
    parser.add_argument("--repository", type=Path, default=None)
    args = parser.parse_args()
    print(json.dumps({"pipelines": PIPELINES,
                      "stale": [p for p in PIPELINES if not is_current(p, args.profile, args.repository)]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
