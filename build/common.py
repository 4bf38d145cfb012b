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

from build import instruction_set

ROOT = Path(__file__).resolve().parent.parent
MODEL_REPOSITORY = ROOT / "model_repository"
PROFILES = ("demo", "hub")
# Demo models trained by `make model`, one folder each, reused while their training code is unchanged.
TRAINED_DIR = ROOT / ".artifacts" / "trained"
RETRAIN_ENV = "DEMO_RETRAIN"  # set (as `make train-demo` does) to train again even when the stamp matches
_output = {"repository": MODEL_REPOSITORY}
# how every demo model is trained (seeds, threads, instruction set): part of each one's stamp
TRAINING_SETUP = [Path(__file__), Path(instruction_set.__file__)]


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


@contextmanager
def single_thread():
    """One torch thread: float sums then run in one order, so training gives the same bytes on every run
    whatever the machine's core count (more threads split reductions differently); the same bytes on
    every CPU also need build/instruction_set.py."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def training_stamp(sources) -> str:
    """What a trained model depends on: its training code (and the data generators it imports), the
    versions of the libraries doing the arithmetic and the instruction set they are held to."""
    from importlib.metadata import PackageNotFoundError, version

    h = hashlib.sha256(instruction_set.in_effect().encode())
    for path in sorted(Path(p).resolve() for p in sources):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    for package in ("torch", "transformers", "tokenizers", "flair", "numpy", "pillow", "faker"):
        try:
            h.update(f"{package}=={version(package)}".encode())
        except PackageNotFoundError:
            h.update(package.encode())
    return h.hexdigest()


def trained_is_current(module) -> bool:
    """Whether a build/train_*.py module's model is trained with its current code (and no retrain asked)."""
    stamp_file = TRAINED_DIR / module.NAME / ".stamp"
    return (not os.environ.get(RETRAIN_ENV) and stamp_file.exists()
            and stamp_file.read_text() == training_stamp(list(module.SOURCES) + TRAINING_SETUP))


def trained(name: str, train, sources) -> Path:
    """.artifacts/trained/<name>/, filled by train(folder) on one thread with fixed seeds and oneDNN
    off (build/instruction_set.py), or reused as it is when the stamp of `sources` is the one it was
    trained with (and DEMO_RETRAIN is unset)."""
    dest = TRAINED_DIR / name
    stamp = training_stamp(list(sources) + TRAINING_SETUP)
    stamp_file = dest / ".stamp"
    if not os.environ.get(RETRAIN_ENV) and stamp_file.exists() and stamp_file.read_text() == stamp:
        print(f"  {name}: trained model reused (training code unchanged; {RETRAIN_ENV}=1 trains again)", flush=True)
        return dest
    work = dest.with_name(name + ".partial")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    start = time.monotonic()
    with single_thread(), instruction_set.without_onednn():
        train(work)
    stamp_file = work / ".stamp"
    stamp_file.write_text(stamp)
    if dest.exists():
        shutil.rmtree(dest)
    work.rename(dest)
    print(f"  {name}: trained in {time.monotonic() - start:.0f}s -> {dest}/", flush=True)
    return dest


class TrainLog:
    """Training progress: a line about every tenth of the steps (and the last), with the running loss."""

    def __init__(self, name: str, total: int):
        self.name, self.total, self.start, self.losses = name, total, time.monotonic(), []
        self.every = max(1, total // 10)

    def step(self, step: int, loss: float) -> None:
        self.losses.append(loss)
        if (step + 1) % self.every == 0 or step + 1 == self.total:
            recent = self.losses[-self.every:]
            print(f"  {self.name}: step {step + 1}/{self.total}, loss {sum(recent) / len(recent):.3f}, "
                  f"{time.monotonic() - self.start:.0f}s", flush=True)
