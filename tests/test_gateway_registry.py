"""The model registry's rules without a server (a fake Triton engine, model generation stubbed): one load
however many clients ask, waiting for a model being loaded (bounded), LRU eviction that never takes a
model with requests in flight, unloads that wait for those requests, delete, and models.json."""
from __future__ import annotations

import asyncio
import json

import pytest

from gateway import errors, modelgen
from gateway.modelgen import ModelSpec
from gateway.registry import ModelRegistry
from gateway.settings import Settings


class FakeEngine:
    def __init__(self):
        self.loads: list[str] = []
        self.unloads: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def load(self, model: str) -> None:
        await self.gate.wait()
        await asyncio.sleep(0.01)
        self.loads.append(model)

    async def unload(self, model: str, unload_dependents: bool = False) -> None:
        self.unloads.append(model)

    async def ready(self, model: str) -> bool:
        return True

    async def live(self) -> bool:
        return True

    async def repository_index(self) -> list[dict]:
        """Unloads finish at once here (the registry waits for Triton to report them done)."""
        return []


@pytest.fixture
def generated(monkeypatch, tmp_path):
    calls: list[str] = []

    def generate(name, pretrained, kind, source, repository, export=None, limits=None):
        calls.append(name)
        base = modelgen.triton_name(name, pretrained)
        return ModelSpec(model_name=name, pretrained=pretrained, kind=kind, dimension=8, max_tokens=16,
                         text_model=base, image_model=None, triton_models=(base, base + "_encoder"), normalized=True)

    monkeypatch.setattr(modelgen, "resolve_source", lambda name, pretrained, kind, roots, hub_options=None: tmp_path)
    monkeypatch.setattr(modelgen, "generate", generate)
    return calls


def registry(tmp_path, **overrides) -> ModelRegistry:
    settings = Settings(data_dir=tmp_path / "data", max_loaded_models=overrides.pop("cap", 2),
                        model_wait_s=overrides.pop("wait", 10.0), request_timeout_s=10.0)
    return ModelRegistry(settings, FakeEngine())


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


def names(reg: ModelRegistry) -> set[str]:
    return {s.model_name for s in reg.loaded() if not s.builtin}


def test_concurrent_loads_of_one_model_load_once(tmp_path, generated):
    async def main():
        reg = registry(tmp_path)
        results = await asyncio.gather(*(reg.load("m/a", None, "sentence_transformer") for _ in range(8)))
        assert len({id(spec) for spec, _ in results}) == 1
        assert sorted(already for _, already in results) == [False] + [True] * 7
        assert generated == ["m/a"] and len(reg.engine.loads) == 1 and reg.loads_started == 1
    run(main())


def test_a_request_waits_for_a_model_being_loaded_bounded(tmp_path, generated):
    async def main():
        reg = registry(tmp_path, wait=0.3)
        reg.engine.gate.clear()  # Triton's load hangs until the gate opens
        load = asyncio.create_task(reg.load("m/a", None, "sentence_transformer"))
        await asyncio.sleep(0.05)
        with pytest.raises(errors.Unavailable, match="MODEL_WAIT_S"):
            async with reg.use("m/a"):
                pass
        waiting = asyncio.create_task(_use(reg, "m/a"))
        await asyncio.sleep(0.05)
        reg.engine.gate.set()
        spec = await waiting
        assert spec.model_name == "m/a"
        with pytest.raises(errors.Unavailable):  # the loading client's wait is bounded too; the load went on
            await load
        assert names(reg) == {"m/a"} and reg.loads_started == 1
    run(main())


async def _use(reg, name):
    async with reg.use(name) as spec:
        return spec


def test_lru_eviction_skips_models_with_requests_in_flight(tmp_path, generated):
    async def main():
        reg = registry(tmp_path, cap=2)
        await reg.load("m/a", None, "sentence_transformer")
        await reg.load("m/b", None, "sentence_transformer")
        async with reg.use("m/a"):  # a is the oldest-used but busy: b goes instead
            await reg.load("m/c", None, "sentence_transformer")
            assert names(reg) == {"m/a", "m/c"}
            assert modelgen.triton_name("m/b", None) in reg.engine.unloads
            async with reg.use("m/c"):  # both busy: no room, a clear 503
                with pytest.raises(errors.Unavailable, match="MAX_LOADED_MODELS"):
                    await reg.load("m/d", None, "sentence_transformer")
        await reg.load("m/d", None, "sentence_transformer")  # now a (least recently used) goes
        assert names(reg) == {"m/c", "m/d"}
        assert "sentence-transformers/all-MiniLM-L6-v2" in {s.model_name for s in reg.loaded()}
    run(main())


def test_unload_waits_for_requests_in_flight(tmp_path, generated):
    async def main():
        reg = registry(tmp_path)
        await reg.load("m/a", None, "sentence_transformer")
        release = asyncio.Event()

        async def request():
            async with reg.use("m/a"):
                await release.wait()
                return "done"

        in_flight = asyncio.create_task(request())
        await asyncio.sleep(0.02)
        unload = asyncio.create_task(reg.unload("m/a", None))
        await asyncio.sleep(0.1)
        assert not unload.done() and reg.engine.unloads == [], "the unload waits"
        with pytest.raises(errors.NotFound, match="m/a"):  # new requests are refused meanwhile
            await _use(reg, "m/a")
        release.set()
        assert await in_flight == "done"
        await unload
        assert modelgen.triton_name("m/a", None) in reg.engine.unloads and names(reg) == set()
    run(main())


def test_state_file_restores_models_and_delete_removes_files(tmp_path, generated, monkeypatch):
    removed = []
    monkeypatch.setattr(modelgen, "remove_generated", lambda name, pretrained, repo: removed.append(name) or 4)

    async def main():
        reg = registry(tmp_path)
        await reg.load("m/a", None, "sentence_transformer")
        await reg.load("clip/x", "tag", "clip")
        saved = json.loads(reg.state_file.read_text())
        assert {(m["model_name"], m["pretrained"], m["kind"]) for m in saved} == {
            ("m/a", None, "sentence_transformer"), ("clip/x", "tag", "clip")}
        again = ModelRegistry(reg.settings, FakeEngine())
        await again.start()
        assert names(again) == {"m/a", "clip/x"}
        await again.delete("m/a", None)
        assert removed == ["m/a"] and names(again) == {"clip/x"}
        assert [m["model_name"] for m in json.loads(reg.state_file.read_text())] == ["clip/x"]
        with pytest.raises(errors.NotFound):
            await _use(again, "m/a")
        with pytest.raises(errors.Conflict, match="shipped"):  # a state conflict: 409 (issue 52)
            await again.unload("sentence-transformers/all-MiniLM-L6-v2", None)
        with pytest.raises(errors.Conflict, match="shipped"):
            await again.delete("sentence-transformers/all-MiniLM-L6-v2", None)
    run(main())
