"""Issue 56 item 11: HUB_ALLOW_PICKLE=0 holds for local folders too. The default MODEL_ROOTS hold the
repository, and with it data/hub_cache: a snapshot refused by its hub id (`hub_pickle_refused`) was served
when named as a folder."""
from __future__ import annotations

import shutil

import pytest

from fake_hub import FakeHub
from gateway import errors, hub
from gateway.modelgen import resolve_source
from gateway_helpers import ST_CLS_DEMO
from model_configs import ROOT


def test_a_snapshot_refused_by_hub_id_is_refused_by_its_path(tmp_path):
    cache = tmp_path / "root" / "hub_cache"  # under the model roots, as DATA_DIR's is under the repository
    with FakeHub() as fake:
        fake.add("fake-org/pickled", ROOT / ST_CLS_DEMO, rename={"model.safetensors": "pytorch_model.bin"})
        allowed = hub.HubOptions(downloads="on", endpoint=fake.url, cache_dir=cache, allow_pickle=True)
        snapshot = resolve_source("fake-org/pickled", None, "sentence_transformer", [tmp_path / "root"], allowed)
        strict = hub.HubOptions(downloads="on", endpoint=fake.url, cache_dir=cache)
        with pytest.raises(errors.HubPickleRefused):
            resolve_source("fake-org/pickled", None, "sentence_transformer", [tmp_path / "root"], strict)
        relative = snapshot.relative_to(tmp_path / "root").as_posix()
        for named in (str(snapshot), relative):  # absolute, and under a model root
            with pytest.raises(errors.HubPickleRefused, match="pytorch_model.bin") as caught:
                resolve_source(named, None, "sentence_transformer", [tmp_path / "root"], strict)
            assert caught.value.status == 422 and caught.value.body()["error"]["code"] == "hub_pickle_refused"


def test_a_local_folder_with_safetensors_or_another_runtimes_export_is_served(tmp_path):
    model = tmp_path / "root" / "model"
    shutil.copytree(ROOT / ST_CLS_DEMO, model)
    (model / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")  # beside safetensors: never served
    (model / "openvino").mkdir()
    (model / "openvino" / "openvino_model.bin").write_bytes(b"IR weights, no pickle")  # never served either
    assert resolve_source(str(model), None, "sentence_transformer", [tmp_path / "root"], hub.HubOptions()) == model
