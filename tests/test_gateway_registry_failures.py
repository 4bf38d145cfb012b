"""Every registry state transition ends in a defined state even when a step raises (issue 34, items 4-6),
and one model id form (item 13): what /v1/models lists, /v1/embeddings accepts. The registry runs against
a fake Triton engine (tests/inprocess_gateway.py) that can be told to fail a load or an unload."""
from __future__ import annotations

import asyncio

import pytest

from gateway import errors, modelgen
from gateway.registry import ModelRegistry
from gateway.settings import Settings
from inprocess_gateway import FakeEngine, inprocess_gateway, stub_generation


@pytest.fixture(autouse=True)
def stubbed(monkeypatch, tmp_path):
    stub_generation(monkeypatch, tmp_path)


def registry(tmp_path, cap: int) -> ModelRegistry:
    settings = Settings(data_dir=tmp_path / "data", max_loaded_models=cap, model_wait_s=10.0, request_timeout_s=10.0)
    return ModelRegistry(settings, FakeEngine())


def runtime_names(reg: ModelRegistry) -> list[tuple[str, str | None]]:
    return sorted((s.model_name, s.pretrained) for s in reg.loaded() if not s.builtin)


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 60))


def test_a_failed_load_unloads_what_it_loaded(tmp_path):
    async def scenario():
        reg = registry(tmp_path, cap=2)
        spec_name = modelgen.triton_name("clip-copy", None)
        reg.engine.fail_load.add(spec_name + "_image")  # the text ensemble loads, the image one fails
        with pytest.raises(errors.Internal):
            await reg.load("clip-copy", None, "clip")
        assert reg.engine.loads == [spec_name + "_text"]
        # everything of it is unloaded again: nothing is left in Triton that no entry accounts for
        assert {spec_name + "_text", spec_name + "_image", spec_name + "_encoder"} <= set(reg.engine.unloads)
        assert await reg.engine.repository_index() == [] and reg.entries == {}
        reg.engine.fail_load.clear()
        spec, already = await reg.load("clip-copy", None, "clip")  # and it can be loaded again
        assert not already and runtime_names(reg) == [("clip-copy", None)]

    run(scenario())


def test_a_failed_unload_leaves_the_model_loaded_counted_and_unloadable(tmp_path):
    async def scenario():
        reg = registry(tmp_path, cap=1)
        await reg.load("st-a", None, "sentence_transformer")
        reg.engine.fail_unload = 2  # the first try and its retry
        with pytest.raises(errors.Internal):
            await reg.unload("st-a", None)
        assert runtime_names(reg) == [("st-a", None)] and reg.entries[("st-a", None)].state == "ready"
        async with reg.use("st-a") as spec:  # still served
            assert spec.model_name == "st-a"
        # it counts toward MAX_LOADED_MODELS: a second model needs room, and making it fails the same way
        reg.engine.fail_unload = 2
        with pytest.raises(errors.Unavailable, match="unloading st-a to make room failed"):
            await reg.load("st-b", None, "sentence_transformer")
        assert runtime_names(reg) == [("st-a", None)] and reg.entries[("st-a", None)].state == "ready"
        # nothing stuck: the next unload and the next load go through
        await reg.unload("st-a", None)
        await reg.load("st-b", None, "sentence_transformer")
        assert runtime_names(reg) == [("st-b", None)]

    run(scenario())


def test_an_unload_that_fails_once_is_retried(tmp_path):
    async def scenario():
        reg = registry(tmp_path, cap=1)
        await reg.load("st-a", None, "sentence_transformer")
        reg.engine.fail_unload = 1
        await reg.unload("st-a", None)
        assert runtime_names(reg) == []

    run(scenario())


def test_concurrent_loads_at_capacity_evict_one_model_each(tmp_path):
    async def scenario():
        reg = registry(tmp_path, cap=5)
        for i in range(5):
            await reg.load(f"st-{i}", None, "sentence_transformer")
        await asyncio.gather(reg.load("new-a", None, "sentence_transformer"),
                             reg.load("new-b", None, "sentence_transformer"))
        names = [n for n, _ in runtime_names(reg)]
        assert len(names) == 5 and {"new-a", "new-b"} <= set(names), names
        assert sorted(set(f"st-{i}" for i in range(5)) - set(names)) == ["st-0", "st-1"]  # the two LRU only

    run(scenario())


def test_every_id_that_v1_models_lists_is_accepted_by_v1_embeddings(tmp_path):
    async def scenario():
        async with inprocess_gateway(tmp_path) as (app, client):
            for tag in ("tag-a", "tag-b"):  # two pretrained variants of one CLIP name
                await app.state.models.load("clip-x", tag, "clip")
            ids = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
            assert {"clip-x|tag-a", "clip-x|tag-b"} <= set(ids)
            for model_id in ids:
                if model_id == app.state.settings.completions_model:
                    continue  # served by /v1/completions
                response = await client.post("/v1/embeddings", json={"model": model_id, "input": "hi"})
                assert response.status_code == 200, (model_id, response.text)
                assert response.json()["model"] == model_id
            asked = [model for model, _ in app.state.engine.inferred]
            assert modelgen.triton_name("clip-x", "tag-a") + "_text" in asked
            assert modelgen.triton_name("clip-x", "tag-b") + "_text" in asked

    run(scenario())
