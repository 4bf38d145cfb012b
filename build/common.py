"""Shared pieces of the model builders: where artifacts go, seeding, and the progress display."""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL_REPOSITORY = ROOT / "model_repository"
PROFILES = ("demo", "hub")
_output = {"repository": MODEL_REPOSITORY}


def use_repository(path: Path) -> None:
    """Build into another folder laid out like model_repository/ (tests check reproducibility)."""
    _output["repository"] = Path(path)


def demo_models_dir() -> Path:
    """Where demo models loaded at run time (not served from model_repository/) are built: demo_models/
    at the repository root, or beside another output folder given with --repository."""
    repository = _output["repository"]
    if repository == MODEL_REPOSITORY:
        return ROOT / "demo_models"
    return repository.with_name(repository.name + "_demo_models")


def version_dir(model_name: str, version: int = 1, clean: bool = True) -> Path:
    """model_repository/<model>/<version>/, emptied first so no stale artifact survives."""
    path = _output["repository"] / model_name / str(version)
    if clean and path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def copy_tree(src: Path, dest: Path) -> None:
    for item in sorted(Path(src).rglob("*")):
        if item.is_file() and "__pycache__" not in item.parts:
            target = dest / item.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(item, target)


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def tree_digest(path: Path) -> str:
    """sha256 over every file's relative path and bytes: equal digests mean byte-identical artifacts."""
    h = hashlib.sha256()
    for item in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        h.update(str(item.relative_to(path)).encode())
        h.update(item.read_bytes())
    return h.hexdigest()


class Progress:
    """Numbered steps with elapsed time, printed as they start and finish."""

    def __init__(self, title: str, total: int):
        self.title, self.total, self.done = title, total, 0
        self.interactive = sys.stdout.isatty() and not os.environ.get("CI")

    @contextmanager
    def step(self, label: str):
        self.done += 1
        prefix = f"[{self.title} {self.done}/{self.total}] {label}"
        print(prefix + " ...", end="" if self.interactive else "\n", flush=True)
        start = time.monotonic()
        yield
        took = time.monotonic() - start
        print(("\r" if self.interactive else "") + f"{prefix} done ({took:.1f}s)", flush=True)
