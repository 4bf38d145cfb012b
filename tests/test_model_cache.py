"""The machine's cache of trained models (build/model_cache.py, build/trained_cache.py): keyed by what determines
the bytes, every entry checked against its manifest before it is served (a bad one is trained again), and two
writers at once leave one whole entry. Toy "trainings" only; XDG_CACHE_HOME points into tmp_path throughout, so
nothing here touches the real ~/.cache."""
from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
import types
from pathlib import Path

import pytest

from build import build_models, common, instruction_set, model_cache, trained_cache

KEY = "ab" * 32


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(common.RETRAIN_ENV, raising=False)
    for name, value in instruction_set.PINNED.items():  # as build_models.py runs
        monkeypatch.setenv(name, value)
    return tmp_path / "xdg" / model_cache.PROJECT


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A trainer module `build.train_toy` whose training writes its code's bytes and counts its runs, and a clone
    of its own (TRAINED_DIR): `clone()` switches to a fresh one, as a second checkout on the machine."""
    code = tmp_path / "train_toy_code.py"
    code.write_text("STEPS = 1\n")
    runs = []

    def train(dest: Path) -> None:
        runs.append(dest)
        (dest / "weights.bin").write_bytes(code.read_bytes() * 1000)
        (dest / "config.json").write_text('{"runs": %d}' % len(runs))

    module = types.SimpleNamespace(NAME="toy", SOURCES=[code], train=train)
    monkeypatch.setitem(sys.modules, "build.train_toy", module)
    clones = []

    def clone() -> Path:
        folder = tmp_path / f"clone{len(clones)}" / "trained"
        clones.append(folder)
        monkeypatch.setattr(common, "TRAINED_DIR", folder)
        return folder

    clone()
    return types.SimpleNamespace(code=code, runs=runs, clone=clone, module=module)


def entry_of(toy) -> Path:
    return model_cache.entry(trained_cache.KIND, toy.module.NAME, trained_cache.key("train_toy"))


def build_toy() -> None:
    """What `make model` does for one trainer: take it from this clone or the cache, else train and publish."""
    if not trained_cache.restore("train_toy"):
        build_models._train_one("train_toy")


def test_the_cache_lives_under_xdg_cache_home(cache_home, monkeypatch):
    assert model_cache.root() == cache_home
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # the XDG spec: ignored
    assert model_cache.root() == Path.home() / ".cache" / model_cache.PROJECT
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert model_cache.root() == Path.home() / ".cache" / model_cache.PROJECT


def test_the_key_changes_with_the_training_code_and_what_it_runs_on(toy, monkeypatch):
    key = trained_cache.key("train_toy")
    assert trained_cache.key("train_toy") == key, "the same inputs, the same key"
    toy.code.write_text("STEPS = 2\n")
    changed = trained_cache.key("train_toy")
    assert changed != key
    monkeypatch.setenv("MKL_CBWR", "AVX2")  # another instruction set
    assert trained_cache.key("train_toy") not in (key, changed)
    monkeypatch.setenv("MKL_CBWR", instruction_set.PINNED["MKL_CBWR"])
    monkeypatch.setattr(trained_cache.platform, "python_version", lambda: "3.99.0")  # another interpreter
    assert trained_cache.key("train_toy") not in (key, changed)


def test_the_key_covers_the_library_versions(toy, monkeypatch):
    import importlib.metadata

    key = trained_cache.key("train_toy")
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.0.1" if name == "torch" else real(name))
    assert trained_cache.key("train_toy") != key


def test_codegen_key_covers_its_data_outside_the_tree(monkeypatch, tmp_path):
    """Codegen learns from the interpreter's standard library: other modules there, another key."""
    from build import codegen

    key = trained_cache.key("train_codegen")
    extra = tmp_path / "zz_extra.py"
    extra.write_text("x = 1\n")
    real = codegen.stdlib_sources
    monkeypatch.setattr(codegen, "stdlib_sources", lambda: real() + [extra])
    assert trained_cache.key("train_codegen") != key


def test_a_second_clone_takes_the_model_from_the_cache(toy):
    first = toy.clone()
    build_toy()
    assert len(toy.runs) == 1
    assert model_cache.problem(entry_of(toy), trained_cache.key("train_toy")) is None
    second = toy.clone()
    build_toy()
    assert len(toy.runs) == 1, "trained again although the cache holds this key"
    assert common.trained_is_current(toy.module), "restored with this clone's stamp"
    assert common.tree_digest(second / "toy") == common.tree_digest(first / "toy")
    assert not (second / "toy.partial").exists()
    toy.code.write_text("STEPS = 2\n")  # changed training code: another key, trained
    toy.clone()
    build_toy()
    assert len(toy.runs) == 2


def test_a_clone_trained_before_the_cache_fills_it(toy):
    """A model this clone trained before the cache existed (its stamp current) is put there, not trained."""
    common.trained("toy", toy.module.train, toy.module.SOURCES)
    assert not entry_of(toy).exists()
    assert trained_cache.restore("train_toy")
    assert model_cache.problem(entry_of(toy), trained_cache.key("train_toy")) is None
    assert not (entry_of(toy) / trained_cache.STAMP).exists(), "the local stamp stays out of the entry"
    assert len(toy.runs) == 1


def _flip_a_byte(entry: Path) -> None:
    weights = entry / "weights.bin"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))


def _truncate(entry: Path) -> None:
    weights = entry / "weights.bin"
    weights.write_bytes(weights.read_bytes()[:10])


def _no_manifest(entry: Path) -> None:  # a writer that died before it finished (and before its rename)
    (entry / model_cache.MANIFEST).unlink()


def _a_file_missing(entry: Path) -> None:
    (entry / "config.json").unlink()


def _an_extra_file(entry: Path) -> None:
    (entry / "pickle.pt").write_bytes(b"not from this training")


def _foreign_manifest(entry: Path) -> None:  # an entry of another key copied or moved here
    manifest = json.loads((entry / model_cache.MANIFEST).read_text())
    manifest["key"] = "cd" * 32
    (entry / model_cache.MANIFEST).write_text(json.dumps(manifest))


def _manifest_garbage(entry: Path) -> None:
    (entry / model_cache.MANIFEST).write_text("{not json")


DAMAGE = [_flip_a_byte, _truncate, _no_manifest, _a_file_missing, _an_extra_file, _foreign_manifest,
          _manifest_garbage]


@pytest.mark.parametrize("damage", DAMAGE, ids=[d.__name__.strip("_") for d in DAMAGE])
def test_a_bad_entry_is_never_served_and_is_trained_again(toy, damage, capsys):
    toy.clone()
    build_toy()
    damage(entry_of(toy))
    second = toy.clone()
    build_toy()
    assert "rejected" in capsys.readouterr().out
    assert len(toy.runs) == 2, "the bad entry was served"
    assert json.loads((second / "toy" / "config.json").read_text()) == {"runs": 2}
    assert model_cache.problem(entry_of(toy), trained_cache.key("train_toy")) is None, "the entry is whole again"
    assert json.loads((entry_of(toy) / "config.json").read_text()) == {"runs": 2}, "the new training's bytes"
    assert [p.name for p in entry_of(toy).parent.iterdir()] == [entry_of(toy).name], "nothing left beside it"


def test_fetch_checks_the_bytes_it_copied(tmp_path):
    """The copy is what is checked: an entry whose files change after the manifest was written is rejected."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a" * 100)
    entry = model_cache.store("kind", "name", KEY, src)
    assert model_cache.fetch("kind", "name", KEY, tmp_path / "ok")
    assert (tmp_path / "ok" / "a.bin").read_bytes() == b"a" * 100
    assert not (tmp_path / "ok" / model_cache.MANIFEST).exists()
    (entry / "a.bin").write_bytes(b"b" * 100)
    assert not model_cache.fetch("kind", "name", KEY, tmp_path / "bad")
    assert list((tmp_path / "bad").iterdir()) == [] and not entry.exists()


def test_what_dead_writers_left_is_swept_and_a_live_writers_folder_kept(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a")
    parent = model_cache.entry("kind", "name", KEY).parent
    dead, live = parent / f".dead{model_cache.PARTIAL}", parent / f".live{model_cache.PARTIAL}"
    for folder in (dead, live):
        folder.mkdir(parents=True)
        (folder / "half.bin").write_bytes(b"x")
    hours_ago = time.time() - 2 * model_cache.ABANDONED_S
    os.utime(dead, (hours_ago, hours_ago))
    model_cache.store("kind", "name", KEY, src)
    assert sorted(p.name for p in parent.iterdir()) == sorted([KEY, live.name])


def test_a_cache_that_cannot_be_written_costs_a_training_not_the_build(toy, tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # no folder can be made under a file
    build_toy()
    assert "not put in the cache" in capsys.readouterr().out
    assert common.trained_is_current(toy.module) and len(toy.runs) == 1


def test_keys_must_be_digests():
    with pytest.raises(ValueError):
        model_cache.entry("trained", "toy", "../../etc")


FILE_BYTES = 8 << 20  # big enough that two writers' copies overlap in time


def _writer(cache_home: str, src: str, barrier, rounds: int) -> None:
    import os

    os.environ["XDG_CACHE_HOME"] = cache_home
    for round_ in range(rounds):
        barrier.wait()
        model_cache.store("trained", "toy", f"{round_:064x}", Path(src))


def test_two_writers_at_once_leave_one_whole_entry(tmp_path, cache_home):
    """Two processes (two clones) store the same key at the same moment, each from files of its own bytes (as if
    training were not deterministic, so a mix would show): each round ends with one entry, wholly one writer's,
    intact, and no temporary folder left."""
    rounds = 4
    sources = []
    for writer in (1, 2):
        src = tmp_path / f"writer{writer}"
        src.mkdir()
        for name in ("a.bin", "b.bin", "c.bin"):
            (src / name).write_bytes(bytes([writer]) * FILE_BYTES)
        sources.append(src)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    procs = [context.Process(target=_writer, args=(str(tmp_path / "xdg"), str(src), barrier, rounds))
             for src in sources]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=300)
        assert proc.exitcode == 0
    names = sorted(p.name for p in (cache_home / "trained" / "toy").iterdir())
    assert names == [f"{r:064x}" for r in range(rounds)], f"leftovers beside the entries: {names}"
    for round_ in range(rounds):
        entry = cache_home / "trained" / "toy" / f"{round_:064x}"
        assert model_cache.problem(entry, f"{round_:064x}") is None
        owners = {(entry / name).read_bytes()[:1] for name in ("a.bin", "b.bin", "c.bin")}
        assert len(owners) == 1, f"round {round_}: files of both writers in one entry"


def test_the_demo_models_make_model_trained_go_into_the_cache_and_back(tmp_path, monkeypatch):
    """The real trainers' keys, on the models `make model` built (.artifacts/trained/): an empty cache is filled
    from this clone, and a fresh clone gets every model back from it, stamped current, without training."""
    modules = [m for ms in build_models.TRAINED_BY.values() for m in ms]
    if not all(common.trained_is_current(trained_cache._module(m)) for m in modules):
        pytest.skip("run `make model` first: the demo models are not trained here")
    for name in modules:
        assert trained_cache.restore(name)
    monkeypatch.setattr(common, "TRAINED_DIR", tmp_path / "fresh_clone")
    # what `make model` would train: nothing, every model comes back from the cache
    assert build_models._stale_trainings(build_models.PIPELINES) == []
    for name in modules:
        module = trained_cache._module(name)
        assert common.trained_is_current(module), name
        original = Path(common.ROOT / ".artifacts" / "trained" / module.NAME)
        assert common.tree_digest(tmp_path / "fresh_clone" / module.NAME) == common.tree_digest(original), name
