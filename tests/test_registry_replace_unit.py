"""Model update without downtime, without a server: `replace` loads the model again under new Triton
names beside the one serving, switches new requests to it at once, and unloads the old one only when its
requests in flight are done; a failed replacement leaves the old one serving."""
from __future__ import annotations

import asyncio
import json

import pytest

from gateway import errors, modelgen
from gateway.modelgen import ModelSpec
from gateway.modelgen.generate import generation_name
from gateway.registry import ModelRegistry
from gateway.settings import Settings
from test_gateway_registry import FakeEngine


@pytest.fixture
def generated(monkeypatch, tmp_path):
    calls: list[int] = []

    def generate(name, pretrained, kind, source, repository, export=None, limits=None, generation=0):
        calls.append(generation)
        base = generation_name(modelgen.triton_name(name, pretrained), generation)
        return ModelSpec(model_name=name, pretrained=pretrained, kind=kind, dimension=8, max_tokens=16,
                         text_model=base, image_model=None, triton_models=(base, base + "_encoder"), normalized=True)

    monkeypatch.setattr(modelgen, "resolve_source", lambda name, pretrained, kind, roots, hub_options=None: tmp_path)
    monkeypatch.setattr(modelgen, "generate", generate)
    monkeypatch.setattr(modelgen, "remove", lambda spec, repository: None)
    return calls


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


def test_replace_switches_new_requests_and_unloads_the_old_after_its_requests(tmp_path, generated):
    async def main():
        reg = ModelRegistry(Settings(data_dir=tmp_path / "data", request_timeout_s=10), FakeEngine())
        old, _ = await reg.load("m/a", None, "sentence_transformer")
        in_flight = reg.use("m/a")
        assert await in_flight.__aenter__() is old  # a request on the old version, still running
        new, already = await reg.load("m/a", None, "sentence_transformer", replace=True)
        assert not already and new.text_model != old.text_model and new.text_model.endswith("_g1")
        assert new.text_model in reg.engine.loads and generated == [0, 1]
        async with reg.use("m/a") as spec:  # the next request gets the new version at once
            assert spec is new
        assert [s.model_name for s in reg.loaded() if not s.builtin] == ["m/a"]  # listed once
        await asyncio.sleep(0.1)
        assert old.text_model not in reg.engine.unloads  # its request is still in flight
        await in_flight.__aexit__(None, None, None)
        for _ in range(50):
            if old.text_model in reg.engine.unloads:
                break
            await asyncio.sleep(0.05)
        assert old.text_model in reg.engine.unloads and new.text_model not in reg.engine.unloads
        async with reg.use("m/a") as spec:
            assert spec is new
        assert json.loads(reg.state_file.read_text()) == [{"model_name": "m/a", "pretrained": None,
                                                           "kind": "sentence_transformer"}]
        again, _ = await reg.load("m/a", None, "sentence_transformer", replace=True)
        assert again.text_model.endswith("_g2")
    run(main())


def test_a_failed_replacement_leaves_the_old_one_serving(tmp_path, generated):
    class Failing(FakeEngine):
        async def load(self, model: str) -> None:
            if model.endswith("_g1"):
                raise errors.internal(RuntimeError("boom"), "test")
            await super().load(model)

    async def main():
        reg = ModelRegistry(Settings(data_dir=tmp_path / "data"), Failing())
        old, _ = await reg.load("m/a", None, "sentence_transformer")
        with pytest.raises(errors.Internal):
            await reg.load("m/a", None, "sentence_transformer", replace=True)
        async with reg.use("m/a") as spec:
            assert spec is old
        assert any(m.endswith("_g1") for m in reg.engine.unloads)  # the half-loaded new one is dropped
    run(main())
