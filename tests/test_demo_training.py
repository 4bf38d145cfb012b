"""Demo-model training is deterministic: the same code trained twice (here for a few steps) writes
byte-identical files, and `make model` retrains only when the training code changes."""
from __future__ import annotations

import pytest

from build import common
from build.common import single_thread, trained, tree_digest


def _train_food(dest):
    from build import train_food

    train_food.train(dest, per_class=2, epochs=1)


def _train_ner(dest):
    from build import train_ner

    train_ner.train(dest, sentences=16, epochs=1)


def _train_clip(dest):
    from build import train_clip

    train_clip.train(dest, pool=8, steps=2)


def _train_codegen(dest):
    from build import train_codegen

    train_codegen.train(dest, steps=2)


def _train_blip(dest):
    from build import train_blip

    train_blip.train(dest, pool=4, steps=2)


TRAINERS = {"blip": _train_blip, "food": _train_food, "ner": _train_ner, "clip": _train_clip, "codegen": _train_codegen}


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_training_twice_gives_the_same_bytes(name, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for dest in (first, second):
        dest.mkdir()
        with single_thread():
            TRAINERS[name](dest)
    assert tree_digest(first) == tree_digest(second)


def test_trained_folder_is_reused_until_the_code_changes(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "TRAINED_DIR", tmp_path / "trained")
    monkeypatch.delenv(common.RETRAIN_ENV, raising=False)
    code = tmp_path / "train_code.py"
    code.write_text("x = 1\n")
    runs = []

    def train(dest):
        runs.append(dest)
        (dest / "weights.bin").write_bytes(b"%d" % len(runs))

    folder = trained("toy", train, [code])
    assert (folder / "weights.bin").read_bytes() == b"1"
    assert trained("toy", train, [code]) == folder and len(runs) == 1
    code.write_text("x = 2\n")
    assert (trained("toy", train, [code]) / "weights.bin").read_bytes() == b"2"
    monkeypatch.setenv(common.RETRAIN_ENV, "1")
    trained("toy", train, [code])
    assert len(runs) == 3
    assert not (tmp_path / "trained" / "toy.partial").exists()
