"""Issue 43 item 5: a sentence-transformers `modules.json` cannot make the generated model serve files
from outside its folder. Every module path must be relative and resolve inside the source folder (hub
snapshot or local folder), else a 400 naming the path; and with HUB_ALLOW_PICKLE=0 no pickled weight file
ends up served from a hub repository, whatever its cache holds, nor from a local folder (issue 56)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from fake_hub import FakeHub
from gateway import errors, hub
from gateway.errors import BadRequest
from gateway.modelgen import ExportOptions, generate, resolve_source
from gateway_helpers import ST_CLS_DEMO
from model_configs import ROOT

NO_EXPORT = ExportOptions(enabled=False)


@pytest.fixture()
def layout(tmp_path):
    """root/model: a copy of st-cls-demo; outside/: a Transformer folder with pickled weights, beside it."""
    model, outside = tmp_path / "root" / "model", tmp_path / "outside"
    shutil.copytree(ROOT / ST_CLS_DEMO, model)
    outside.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(model / name, outside / name)
    (outside / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    shutil.copytree(model / "1_Pooling", outside / "1_Pooling")
    return model, outside


def _set_path(model: Path, index: int, path) -> None:
    modules = json.loads((model / "modules.json").read_text())
    modules[index]["path"] = path
    (model / "modules.json").write_text(json.dumps(modules))


def _links_out(repository: Path, outside: Path) -> list[Path]:
    return [p for p in repository.rglob("*") if p.is_symlink() and outside in p.resolve().parents]


@pytest.mark.parametrize("index, path", [
    (0, "{outside}"),  # absolute
    (0, "../../outside"),
    (0, "1_Pooling/../../../outside"),
    (0, "./../../outside"),
    (1, "../../outside/1_Pooling"),
    (1, "/{outside}/1_Pooling"),
    (2, "../../outside"),  # Normalize: read by nobody today, refused all the same
])
def test_a_module_path_out_of_the_folder_is_a_400_naming_it(layout, tmp_path, index, path):
    model, outside = layout
    path = path.format(outside=outside).replace("//", "/")
    _set_path(model, index, path)
    repository = tmp_path / "repository"
    with pytest.raises(BadRequest) as caught:
        generate("m", None, "sentence_transformer", model, repository, export=NO_EXPORT)
    assert caught.value.status == 400 and path in caught.value.message
    assert not _links_out(repository, outside)


def test_a_module_folder_that_is_a_symlink_out_of_the_folder_is_refused(layout, tmp_path):
    model, outside = layout
    os.symlink(outside, model / "0_Transformer")
    _set_path(model, 0, "0_Transformer")
    with pytest.raises(BadRequest, match="0_Transformer"):
        generate("m", None, "sentence_transformer", model, tmp_path / "repository", export=NO_EXPORT)


@pytest.mark.parametrize("path", [None, 3, ["x"], "a\\..\\..\\outside"])
def test_a_module_path_that_is_not_a_relative_name_is_refused(layout, tmp_path, path):
    model, _ = layout
    _set_path(model, 0, path)
    with pytest.raises(BadRequest, match="modules.json"):
        generate("m", None, "sentence_transformer", model, tmp_path / "repository", export=NO_EXPORT)


def test_module_folders_inside_the_model_are_served(layout, tmp_path):
    model, _ = layout
    (model / "0_Transformer").mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "model.safetensors"):
        shutil.move(model / name, model / "0_Transformer" / name)
    _set_path(model, 0, "0_Transformer/")
    spec = generate("m", None, "sentence_transformer", model, tmp_path / "repository", export=NO_EXPORT)
    served = tmp_path / "repository" / spec.triton_models[2] / "1" / "model.safetensors"
    assert served.resolve() == (model / "0_Transformer" / "model.safetensors").resolve()


def test_pickled_weights_beside_safetensors_are_never_served(layout, tmp_path):
    model, _ = layout
    (model / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    spec = generate("m", None, "sentence_transformer", model, tmp_path / "repository", export=NO_EXPORT)
    served = {p.name for p in (tmp_path / "repository" / spec.triton_models[2] / "1").iterdir()}
    assert "model.safetensors" in served and "pytorch_model.bin" not in served


def test_hub_allow_pickle_0_holds_for_a_cache_filled_while_it_was_1(tmp_path):
    """A repository with pickled weights only, downloaded with HUB_ALLOW_PICKLE=1, is refused once the
    setting is 0 again, though its complete download is still in the cache."""
    with FakeHub() as fake:
        fake.add("fake-org/pickled", ROOT / ST_CLS_DEMO, rename={"model.safetensors": "pytorch_model.bin"})
        options = hub.HubOptions(downloads="on", endpoint=fake.url, cache_dir=tmp_path / "cache", allow_pickle=True)
        folder = resolve_source("fake-org/pickled", None, "sentence_transformer", [tmp_path / "none"], options)
        assert (folder / "pytorch_model.bin").is_file()
        strict = hub.HubOptions(downloads="on", endpoint=fake.url, cache_dir=tmp_path / "cache")
        with pytest.raises(errors.HubPickleRefused, match="pytorch_model.bin") as caught:
            resolve_source("fake-org/pickled", None, "sentence_transformer", [tmp_path / "none"], strict)
        assert caught.value.status == 422


def test_local_folders_serve_their_pickled_weights_with_hub_allow_pickle_1_only(layout, tmp_path):
    """HUB_ALLOW_PICKLE holds for a folder under MODEL_ROOTS too (issue 56: the repository's own
    data/hub_cache is under MODEL_ROOTS, so a refused snapshot could be named as a folder):
    tests/test_abuse3_pickle.py."""
    model, _ = layout
    (model / "model.safetensors").rename(model / "pytorch_model.bin")
    with pytest.raises(errors.HubPickleRefused, match="MODEL_ROOTS"):
        resolve_source(str(model), None, "sentence_transformer", [model.parent], hub.HubOptions())
    folder = resolve_source(str(model), None, "sentence_transformer", [model.parent],
                            hub.HubOptions(allow_pickle=True))
    spec = generate("m", None, "sentence_transformer", folder, tmp_path / "repository", export=NO_EXPORT)
    assert (tmp_path / "repository" / spec.triton_models[2] / "1" / "pytorch_model.bin").is_symlink()
