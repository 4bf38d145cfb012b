"""The demo models of build/train_*.py in the machine's cache (build/model_cache.py): `make model` takes a
stale model from there before it trains it, and puts each model it trains (or finds trained in this clone's
.artifacts/trained/, from before the cache) there for the other clones.

A model's key covers what its local stamp covers (build/common.training_stamp: its training code and the data
generators it imports, with their seeds; the versions of torch, transformers, tokenizers, flair, numpy,
Pillow and Faker; the pinned instruction set), plus what a stamp can leave out because one clone keeps one
interpreter in its .venv, but the clones of a machine need not: the interpreter's version and the machine's
architecture, and the training data that comes with the interpreter (codegen learns from the standard
library's modules). This file is in no model's stamp: changing it trains nothing (another key() only makes
the cache fill again, from the clones' trained models).
"""
from __future__ import annotations

import hashlib
import importlib
import os
import platform
import shutil
import sys
from pathlib import Path

from build import common, model_cache

KIND = "trained"
STAMP = ".stamp"  # the local stamp file inside .artifacts/trained/<name>/ (build/common.trained)


def _outside_data(module_name: str) -> list[Path]:
    """Training data outside the tree (read at training time, so not in the module's SOURCES)."""
    if module_name == "train_codegen":
        from build.codegen import stdlib_sources

        return stdlib_sources()
    return []


def _module(module_name: str):
    return importlib.import_module(f"build.{module_name}")


def stamp(module_name: str) -> str:
    return common.training_stamp(list(_module(module_name).SOURCES) + common.TRAINING_SETUP)


def key(module_name: str) -> str:
    """sha256 over the local stamp, the interpreter, the architecture and the data outside the tree."""
    h = hashlib.sha256(stamp(module_name).encode())
    h.update(f"{sys.implementation.name} {platform.python_version()} {platform.machine()}".encode())
    for path in _outside_data(module_name):
        h.update(path.name.encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def publish(module_name: str) -> None:
    """Put this clone's trained model (its stamp current) in the cache unless an entry is there. A cache that
    cannot be written (a read-only home) only costs the other clones a training."""
    module = _module(module_name)
    entry_key = key(module_name)
    if model_cache.has(KIND, module.NAME, entry_key):
        return
    try:
        model_cache.store(KIND, module.NAME, entry_key, common.TRAINED_DIR / module.NAME, exclude=(STAMP,))
    except OSError as error:
        print(f"make model: {module.NAME} not put in the cache {model_cache.root()}: {error}", flush=True)


def restore(module_name: str) -> bool:
    """Whether .artifacts/trained/<name>/ is current: it was (then it is put in the cache if missing there), or
    it is now, copied from an intact cache entry and stamped. False: it must be trained (always under
    DEMO_RETRAIN, which asks for a training whatever is kept)."""
    module = _module(module_name)
    if os.environ.get(common.RETRAIN_ENV):
        return False
    if common.trained_is_current(module):
        publish(module_name)
        return True
    entry_key = key(module_name)
    dest = common.TRAINED_DIR / module.NAME
    work = dest.with_name(module.NAME + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if not model_cache.fetch(KIND, module.NAME, entry_key, work):
        shutil.rmtree(work)
        return False
    (work / STAMP).write_text(stamp(module_name))
    shutil.rmtree(dest, ignore_errors=True)
    work.rename(dest)
    print(f"make model: {module.NAME} taken from the cache ({model_cache.entry(KIND, module.NAME, entry_key)})",
          flush=True)
    return True
