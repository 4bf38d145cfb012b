"""The models the gateway serves: shipped ones (always there) and runtime-loaded ones, at most
`max_loaded_models` of the latter, least recently used evicted first (never one with requests in
flight). A load runs once however many clients ask for it, in a task of its own (a client that goes
away does not cancel it); requests for a model being loaded wait for it, bounded; an unload waits for
the requests in flight. The set of loaded models is saved in DATA_DIR/models.json and restored at start."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator

from gateway import errors, hub, modelgen
from gateway.modelgen import ModelSpec
from gateway.settings import Settings
from gateway.triton.engine import TritonEngine

log = logging.getLogger("gateway.registry")
KINDS = ("sentence_transformer", "clip")
Key = tuple[str, str | None]


def model_id(model_name: str, pretrained: str | None) -> str:
    """The id /v1/models lists and every endpoint accepts (ModelRegistry.key reads it back)."""
    return f"{model_name}|{pretrained}" if pretrained else model_name


@dataclass(eq=False)
class Entry:
    key: Key
    kind: str
    spec: ModelSpec | None = None
    # loading -> ready -> unloading; ready -> resyncing -> ready (gateway/triton/server_watch.py)
    state: str = "loading"
    ready: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    last_used: float = field(default_factory=time.monotonic)
    generation: int = 0  # > 0: loaded beside an older one by `replace` (other Triton names)
    replacing: asyncio.Task | None = None  # its replacement being loaded

    @property
    def label(self) -> str:
        return self.key[0] + (f" ({self.key[1]})" if self.key[1] else "")


class ModelRegistry:
    def __init__(self, settings: Settings, engine: TritonEngine):
        self.settings, self.engine = settings, engine
        self.repository = settings.generated_repository
        self.builtin = {spec.model_name: spec for spec in modelgen.builtin_specs()}
        self.entries: dict[Key, Entry] = {}
        self._lock = asyncio.Lock()
        self.loads_started = 0  # generate + Triton load runs, for tests and logs
        self._tasks: set[asyncio.Task] = set()
        self.on_lost = lambda: None  # gateway/triton/server_watch.py: a request found a model missing in Triton
        self.export = modelgen.ExportOptions(enabled=settings.onnx_export, timeout_s=settings.onnx_export_timeout_s,
                                             tolerance=settings.onnx_export_tolerance, cache_dir=settings.onnx_cache)

    # ---- start / stop -------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.settings.data_dir / "models.json"

    async def start(self) -> None:
        """Load what was loaded before the last stop, then the PRELOAD_MODELS; failures are logged."""
        self.repository.mkdir(parents=True, exist_ok=True)
        wanted: list[tuple[str, str | None, str]] = []
        try:
            wanted += [(m["model_name"], m.get("pretrained"), m["kind"]) for m in json.loads(self.state_file.read_text())]
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError) as exc:
            log.error("ignoring unreadable %s: %s", self.state_file, exc)
        for item in self.settings.preload_models:
            if self.parse_preload(item) not in wanted:
                wanted.append(self.parse_preload(item))
        if [w for w in wanted if w[0] not in self.builtin]:
            await self._wait_for_server()
        for name, pretrained, kind in wanted:
            if name in self.builtin:
                continue
            try:
                await self.load(name, pretrained, kind)
                log.info("loaded %s at start", name)
            except errors.ApiError as exc:
                log.error("could not load %s at start: %s", name, exc.message)

    @staticmethod
    def parse_preload(item: str) -> tuple[str, str | None, str]:
        """A PRELOAD_MODELS item, "clip:<name>[|pretrained]" or "st:<name>" / "<name>": (name, pretrained, kind)."""
        prefix, sep, rest = item.partition(":")
        kind = {"clip": "clip", "st": "sentence_transformer"}.get(prefix) if sep else None
        name, _, pretrained = (rest if kind else item).partition("|")
        return name, pretrained or None, kind or "sentence_transformer"

    async def _wait_for_server(self) -> None:
        """A gateway started beside a Triton that is not up yet (the Kustomize pod starts both containers
        at once) waits for it, bounded by MODEL_WAIT_S, before loading: its models would fail otherwise."""
        deadline = time.monotonic() + self.settings.model_wait_s
        while not await self.engine.live():
            if time.monotonic() > deadline:
                log.error("Triton is not live after %.0fs (MODEL_WAIT_S): loading the saved models anyway",
                          self.settings.model_wait_s)
                return
            await asyncio.sleep(0.5)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        modelgen.onnx_cache.stop_exports()  # a generate thread must not keep the process alive until it ends
        hub.stop_downloads()  # nor a hub download

    def _save(self) -> None:
        models = [{"model_name": e.key[0], "pretrained": e.key[1], "kind": e.kind}
                  for e in self.entries.values() if e.state in ("ready", "resyncing")]
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(models, indent=1))
        os.replace(tmp, self.state_file)

    # ---- lookups --------------------------------------------------------------------------------
    @staticmethod
    def key(model_name: str, pretrained: str | None) -> Key:
        """`model_id`'s form ("name|pretrained", what /v1/models lists) is accepted wherever a name is."""
        name, pretrained = model_name.strip(), (pretrained or "").strip() or None
        if pretrained is None and "|" in name:
            name, _, tag = name.partition("|")
            name, pretrained = name.strip(), tag.strip() or None
        return (name, pretrained)

    def _find(self, model_name: str, pretrained: str | None) -> Entry | ModelSpec | None:
        if model_name in self.builtin:
            return self.builtin[model_name]
        key = self.key(model_name, pretrained)
        if key in self.entries:
            return self.entries[key]
        if key[1] is None:  # a CLIP model loaded with a pretrained tag may be named without it
            named = [e for k, e in self.entries.items() if k[0] == key[0]]
            if len(named) == 1:
                return named[0]
        return None

    def reloading(self) -> list[ModelSpec]:
        """Held models being loaded again into a restarted Triton server (not served until then)."""
        return [e.spec for e in self.entries.values() if e.state == "resyncing" and e.spec]

    def loaded(self) -> list[ModelSpec]:
        runtime = [e.spec for e in self.entries.values() if e.state == "ready" and e.spec]
        return list(self.builtin.values()) + runtime

    async def ready_on(self) -> dict[str, list[str]]:
        """Model id -> the replicas where it is ready: this one (gateway/registry/ knows the others)."""
        return {model_id(e.key[0], e.key[1]): [self.settings.replica_id]
                for e in self.entries.values() if e.state == "ready"}

    async def placement(self, model_id_: str, wait_all: bool = False) -> dict:
        """Where a model just registered is ready (the registration's answer says it)."""
        ready = (await self.ready_on()).get(model_id_, [])
        return {"ready": len(ready), "live": 1, "ready_on": ready}

    async def pending(self) -> list:
        """Registered models not ready here yet: none without a shared registry."""
        return []

    async def triton_models_in_use(self) -> list[str]:
        return [m for spec in self.loaded() if not spec.builtin or await self.engine.ready(spec.text_model)
                for m in spec.ensembles]

    # ---- use ------------------------------------------------------------------------------------
    @asynccontextmanager
    async def use(self, model_name: str, pretrained: str | None = None) -> AsyncIterator[ModelSpec]:
        """The model's spec while a request uses it (an unload waits until the request is done)."""
        found = self._find(model_name, pretrained)
        if isinstance(found, ModelSpec):
            yield found
            return
        if found is None or found.state == "unloading":
            raise errors.NotFound(f"model '{model_name}' is not loaded", param="model", code="model_not_found")
        if found.state == "resyncing":
            raise errors.Unavailable(f"model '{found.label}' is being loaded again into the restarted Triton server; "
                                     "retry later", retry_after=2, code="model_reloading")
        if found.state == "loading":
            await self._wait_ready(found)
        found.in_flight += 1
        found.idle.clear()
        found.last_used = time.monotonic()
        try:
            yield found.spec
        except errors.NotFound as exc:
            if exc.code != "model_not_found" or found.state != "ready":
                raise
            # Triton no longer has it: a new server underneath; the watch loads it again
            self.on_lost()
            raise errors.Unavailable(f"model '{found.label}' is not in the Triton server now (restarted?); "
                                     "retry later", retry_after=2, code="model_reloading") from None
        finally:
            found.in_flight -= 1
            if found.in_flight == 0:
                found.idle.set()

    async def _wait_ready(self, entry: Entry) -> ModelSpec:
        try:
            return await asyncio.wait_for(asyncio.shield(entry.ready), self.settings.model_wait_s)
        except asyncio.TimeoutError:
            raise errors.Unavailable(f"model '{entry.label}' is still loading after {self.settings.model_wait_s:g}s "
                                     "(MODEL_WAIT_S); retry later", retry_after=5) from None

    # ---- load -----------------------------------------------------------------------------------
    async def load(self, model_name: str, pretrained: str | None, kind: str,
                   replace: bool = False) -> tuple[ModelSpec, bool]:
        """(spec, was_already_loaded). Concurrent loads of one model share one load. `replace` on a loaded
        model: its files are read again and loaded beside it (see `_replace`)."""
        if kind not in KINDS:
            raise errors.BadRequest(f"unknown model kind {kind!r}")
        if model_name in self.builtin:
            spec = self.builtin[model_name]
            if spec.kind != kind:
                raise errors.Conflict(f"model '{model_name}' is a {spec.kind}, not a {kind}", param="model_name")
            return spec, True
        key = self.key(model_name, pretrained)
        async with self._lock:
            entry = self.entries.get(key)
            if entry is not None and entry.state == "unloading":
                raise errors.Conflict(f"model '{entry.label}' is being unloaded; load it again when that is done",
                                      param="model_name")
            existed = entry is not None
            if replace and entry is not None and entry.state == "ready" and entry.kind == kind:
                if entry.replacing is None or entry.replacing.done():
                    entry.replacing = asyncio.get_running_loop().create_task(self._replace(entry))
                    self._tasks.add(entry.replacing)
                    entry.replacing.add_done_callback(self._tasks.discard)
                replacing = entry.replacing
            else:
                replacing = None
            if entry is None:
                entry = self.entries[key] = Entry(key, kind)
                task = asyncio.get_running_loop().create_task(self._load(entry))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        if existed and entry.kind != kind:
            raise errors.Conflict(f"model '{entry.label}' is loaded as a {entry.kind}, not a {kind}", param="model_name")
        if replacing is not None:
            return await asyncio.shield(replacing), False
        return await self._wait_ready(entry), existed and entry.state == "ready"

    async def _replace(self, old: Entry) -> ModelSpec:
        """Model update without downtime: generate the model again under new Triton names (the next
        generation), load it beside the one serving, switch new requests to it in one step, then unload the
        old one once its requests in flight are done. A failure leaves the old one serving. (For the
        moment both count as one model against MAX_LOADED_MODELS.)"""
        name, pretrained = old.key
        new = Entry(old.key, old.kind, generation=old.generation + 1)
        new.ready.add_done_callback(lambda f: f.exception())  # nobody waits on it: retrieved
        try:
            self.loads_started += 1
            source = await asyncio.to_thread(modelgen.resolve_source, name, pretrained, old.kind,
                                             self.settings.model_roots, self.settings.hub_options())
            spec = await asyncio.to_thread(modelgen.generate, name, pretrained, old.kind, source, self.repository,
                                           export=self.export, limits=modelgen.ImageLimits.of(self.settings),
                                           generation=new.generation)
            started = time.monotonic()
            try:
                for ensemble in spec.ensembles:
                    await self.engine.load(ensemble)
            except BaseException:
                await self._drop_models(spec)
                raise
        except errors.ApiError:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the caller gets an id, the log the details
            raise errors.internal(exc, f"replacing {old.label}") from None
        new.spec, new.state = spec, "ready"
        new.idle.set()
        new.ready.set_result(spec)
        async with self._lock:
            if self.entries.get(old.key) is not old or old.state != "ready":  # unloaded meanwhile
                await self._drop_models(spec)
                raise errors.Conflict(f"model '{old.label}' was unloaded while its replacement loaded",
                                      param="model_name")
            self.entries[old.key] = new  # the switch: every request from now on gets the new one
            old.state = "unloading"
        self._save()
        log.info("model %s replaced by generation %d (%s, loaded in %.1fs); the old one unloads after its "
                 "%d requests in flight", old.label, new.generation, ", ".join(spec.ensembles),
                 time.monotonic() - started, old.in_flight)
        task = asyncio.get_running_loop().create_task(self._retire(old))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return spec

    async def _retire(self, old: Entry) -> None:
        await self._unload_entry(old)
        if old.spec is not None:
            await asyncio.to_thread(modelgen.remove, old.spec, self.repository)

    async def _drop_models(self, spec: ModelSpec) -> None:
        for ensemble in spec.ensembles:
            try:
                await self.engine.unload(ensemble, unload_dependents=True)
            except errors.ApiError:
                pass

    async def _load(self, entry: Entry) -> None:
        name, pretrained = entry.key
        spec = None
        try:
            self.loads_started += 1
            await self._make_room(entry)
            source = await asyncio.to_thread(modelgen.resolve_source, name, pretrained, entry.kind,
                                             self.settings.model_roots, self.settings.hub_options())
            spec = await asyncio.to_thread(modelgen.generate, name, pretrained, entry.kind, source, self.repository,
                                           export=self.export, limits=modelgen.ImageLimits.of(self.settings))
            started = time.monotonic()
            for ensemble in spec.ensembles:  # Triton loads an ensemble's composing models with it
                await self.engine.load(ensemble)
            log.info("model %s loaded into Triton as %s in %.1fs (encoder on %s)", entry.label,
                     ", ".join(spec.ensembles), time.monotonic() - started, spec.runtime)
            entry.spec, entry.state = spec, "ready"
            entry.idle.set()
            self._save()
            entry.ready.set_result(spec)
        except BaseException as exc:  # noqa: BLE001 - every waiter gets the failure
            error = exc if isinstance(exc, errors.ApiError) else errors.internal(exc, f"loading {entry.label}")
            if spec is not None and not isinstance(exc, asyncio.CancelledError):
                await self._unload_models(entry, spec)  # what Triton did load (a failed ensemble's steps)
            self.entries.pop(entry.key, None)
            if not entry.ready.done():
                entry.ready.set_exception(error)
                entry.ready.exception()  # retrieved: no "never retrieved" warning when nobody waits
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def _make_room(self, new: Entry) -> None:
        while True:
            async with self._lock:
                # an entry being unloaded already freed its slot for the load that chose it as the victim
                others = [e for e in self.entries.values() if e is not new and e.state != "unloading"]
                if len(others) < self.settings.max_loaded_models:
                    return
                idle = [e for e in others if e.state == "ready" and e.in_flight == 0]
                if not idle:
                    raise errors.Unavailable(f"{self.settings.max_loaded_models} models are loaded (MAX_LOADED_MODELS) "
                                             "and none can be unloaded now (loading or serving requests)", retry_after=5)
                victim = min(idle, key=lambda e: e.last_used)
                victim.state = "unloading"
            log.info("capacity %d reached: unloading the least recently used model %s",
                     self.settings.max_loaded_models, victim.label)
            try:
                await self._unload_entry(victim)
            except errors.ApiError as exc:
                raise errors.Unavailable(f"{self.settings.max_loaded_models} models are loaded (MAX_LOADED_MODELS) "
                                         f"and unloading {victim.label} to make room failed: {exc.message}",
                                         retry_after=5) from None

    # ---- unload / delete ------------------------------------------------------------------------
    async def unload(self, model_name: str, pretrained: str | None) -> ModelSpec:
        if model_name in self.builtin:
            raise errors.Conflict(f"model '{model_name}' is shipped with the server and cannot be unloaded",
                                    param="model_name")
        found = self._find(model_name, pretrained)
        if found is None or found.state == "unloading":
            raise errors.NotFound(f"model '{model_name}' is not loaded", param="model_name", code="model_not_found")
        if found.state == "loading":
            await self._wait_ready(found)
        if found.state != "ready":  # another unload took it meanwhile
            raise errors.NotFound(f"model '{model_name}' is not loaded", param="model_name", code="model_not_found")
        found.state = "unloading"  # new requests get 404 from here on; those in flight finish
        await self._unload_entry(found)
        return found.spec

    async def _unload_entry(self, entry: Entry) -> None:
        """entry.state is "unloading". It ends removed, or, when Triton's unload fails twice (or the caller
        is cancelled), back in "ready": listed, counted toward MAX_LOADED_MODELS, and unloadable again."""
        try:
            try:
                await asyncio.wait_for(entry.idle.wait(), self.settings.request_timeout_s)
            except asyncio.TimeoutError:
                log.warning("unloading %s with %d requests still in flight", entry.label, entry.in_flight)
            for attempt in (1, 2):
                try:
                    await self._unload_triton(entry.spec)
                    break
                except Exception as exc:  # noqa: BLE001 - retried once, then reported
                    if attempt == 2:
                        raise errors.internal(exc, f"unloading {entry.label}") from None
                    log.warning("unloading %s failed (%s); retrying", entry.label, exc)
        except BaseException:
            entry.state = "ready"
            raise
        if self.entries.get(entry.key) is entry:  # not when its replacement holds the key
            self.entries.pop(entry.key, None)
        self._save()
        log.info("model %s unloaded", entry.label)

    async def _unload_triton(self, spec: ModelSpec) -> None:
        for ensemble in spec.ensembles:
            await self.engine.unload(ensemble, unload_dependents=True)
        for model in spec.triton_models:  # a composing model shared by two ensembles, if any is left
            await self.engine.unload(model)
        await self._wait_gone(spec.triton_models or spec.ensembles)

    async def _unload_models(self, entry: Entry, spec: ModelSpec) -> None:
        """After a failed load: unload each of its models, each attempted whatever the others do."""
        for name, dependents in [(m, True) for m in spec.ensembles] + [(m, False) for m in spec.triton_models]:
            try:
                await self.engine.unload(name, unload_dependents=dependents)
            except Exception as exc:  # noqa: BLE001 - the load's own error is what the client gets
                log.error("after the failed load of %s, unloading %s failed: %s", entry.label, name, exc)
        try:
            await self._wait_gone(spec.triton_models or spec.ensembles)
        except Exception as exc:  # noqa: BLE001
            log.error("after the failed load of %s, waiting for its unload failed: %s", entry.label, exc)

    async def _wait_gone(self, models: tuple[str, ...], timeout_s: float = 120.0) -> None:
        """Triton's unload returns while the stubs are still stopping. Loading the same names again in that
        window was seen to hang Triton's load for good (the new stubs failed to start), so an unload is
        done only when none of its models is LOADING, READY or UNLOADING any more."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            busy = {m.get("name") for m in await self.engine.repository_index()
                    if m.get("state") in ("LOADING", "READY", "UNLOADING")}
            if not busy.intersection(models):
                return
            await asyncio.sleep(0.2)
        log.warning("models %s still not unloaded after %.0fs", ", ".join(models), timeout_s)

    async def delete(self, model_name: str, pretrained: str | None, kind: str | None = None) -> None:
        """Unload if loaded, then remove the generated folders; 404 if there is nothing to delete."""
        if model_name in self.builtin:
            raise errors.Conflict(f"model '{model_name}' is shipped with the server and cannot be deleted",
                                    param="model_name")
        found = self._find(model_name, pretrained)
        key = found.key if isinstance(found, Entry) else self.key(model_name, pretrained)
        if isinstance(found, Entry):
            await self.unload(model_name, pretrained)
        removed = await asyncio.to_thread(modelgen.remove_generated, key[0], key[1], self.repository)
        if not removed and found is None:
            raise errors.NotFound(f"model '{model_name}' has no generated files to delete", param="model_name",
                                  code="model_not_found")
