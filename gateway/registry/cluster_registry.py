"""The model registry of a replica among several (REDIS_URL set): what is registered lives in Redis
(gateway/registry/registrations.py); each replica reconciles its own Triton to that set.

- A registration goes to Redis first (the cluster-wide cap and LRU eviction, one Lua script), then loads
  here; it returns once the model is ready here, and says on how many replicas it is ready (`?wait=all`
  waits for every live replica, bounded by MODEL_WAIT_S). A failed first load takes the registration back.
- Every replica reconciles: on each change published on the registry's channel, and every CLUSTER_SYNC_S
  as a backstop, it loads what is registered and missing here, unloads what is here and no longer
  registered, and loads again what a replace gave a newer version.
- A request for a registered model that this replica has not loaded yet waits for its load (bounded, as a
  request for a loading model does); it never fails for that reason. A load that failed here is tried
  again once per RETRY_FAILED_S, by the reconcile or by a request; requests in between get a 503 with
  Retry-After (issue 43 item 8: each request used to start a whole new load).
- A heartbeat (every CLUSTER_HEARTBEAT_S, with a TTL) says this replica is alive, which models are ready
  here, and when each was last used (the cluster-wide LRU order the cap evicts by).

Shipped pipelines stay per replica (every replica serves them); only runtime-registered models are shared."""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator

import redis.exceptions

from gateway import errors, modelgen
from gateway.registry.registrations import RedisRegistrations, Registration
from gateway.modelgen import ModelSpec
from gateway.registry.model_registry import KINDS, Entry, ModelRegistry, model_id

log = logging.getLogger("gateway.cluster")
RETRY_FAILED_S = 30.0  # a registered model that failed to load here is tried again after this


async def wait_event(event: asyncio.Event, seconds: float) -> None:
    """Until the event is set or the time is up. Not `asyncio.wait_for`: on 3.11 it can swallow a cancel
    that lands as the event is set, and a loop written with it then never ends (seen in close())."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        pass


def _unreachable(settings, exc: Exception) -> errors.Unavailable:
    return errors.Unavailable(f"the shared model registry (Redis at REDIS_URL) is unreachable: {type(exc).__name__}; "
                              "retry later", retry_after=2, code="registry_unavailable")


class ClusterRegistry(ModelRegistry):
    def __init__(self, settings, engine, shared: RedisRegistrations | None = None):
        super().__init__(settings, engine)
        self.replica = settings.replica_id
        self.shared = shared or RedisRegistrations(settings.redis_url, settings.redis_prefix,
                                                   settings.cluster_heartbeat_ttl_s)
        self.desired: dict[str, Registration] = {}  # as of the last reconcile
        self.versions: dict[str, int] = {}  # model id -> the registration version loaded here
        self.failed: dict[str, float] = {}  # model id -> when its load here last failed
        self.reconciles = 0
        self._deleted: set[str] = set()  # deleted (not only unloaded) ids: their generated files go too
        self._wake = asyncio.Event()
        self._flushed_use: dict[str, float] = {}
        self._loops: list[asyncio.Task] = []
        self._closing = False

    # ---- start / stop -------------------------------------------------------------------------
    async def start(self) -> None:
        """Register the PRELOAD_MODELS (if the cap allows), load what the cluster has registered, then
        follow it. The local models.json is not read: Redis is the record."""
        self.repository.mkdir(parents=True, exist_ok=True)
        for item in self.settings.preload_models:
            name, pretrained, kind = self.parse_preload(item)
            if name in self.builtin:
                continue
            try:
                await self.shared.register(Registration(name, pretrained, kind, by=self.replica, at=time.time()),
                                           self.settings.max_loaded_models, self.settings.model_wait_s)
            except redis.exceptions.RedisError as exc:
                log.error("could not register the preloaded %s (Redis: %s)", name, exc)
        try:
            wanted = await self.shared.all()
        except redis.exceptions.RedisError as exc:
            log.error("the shared registry at REDIS_URL is unreachable (%s): starting with the shipped models; "
                      "the registered ones follow when it answers", exc)
            wanted = {}
        if wanted:
            await self._wait_for_server()
            await self.reconcile()
        loop = asyncio.get_running_loop()
        self._loops = [loop.create_task(self._sync_loop()), loop.create_task(self._listen()),
                       loop.create_task(self._heartbeat_loop())]
        log.info("replica %s follows the shared registry at %s (%d models registered)", self.replica,
                 self.settings.redis_url.split("@")[-1], len(wanted))

    async def close(self) -> None:
        self._closing = True  # a cancel that a Redis call turns into a ConnectionError still ends the loops
        self._wake.set()
        for task in self._loops:
            task.cancel()
        await asyncio.wait(self._loops, timeout=10) if self._loops else None
        try:
            await asyncio.wait_for(self.shared.leave(self.replica), 2)
        except Exception:  # noqa: BLE001 - its heartbeat expires anyway
            pass
        await self.shared.close()
        await super().close()

    def wake(self) -> None:
        self._wake.set()

    # ---- registration -------------------------------------------------------------------------
    async def load(self, model_name: str, pretrained: str | None, kind: str,
                   replace: bool = False) -> tuple[ModelSpec, bool]:
        if kind not in KINDS or model_name in self.builtin:
            return await super().load(model_name, pretrained, kind, replace)
        name, pretrained = self.key(model_name, pretrained)
        reg = Registration(name, pretrained, kind, by=self.replica, at=time.time())
        try:
            status, value = await self.shared.register(reg, self.settings.max_loaded_models,
                                                       self.settings.model_wait_s)
            if status == "exists" and value.kind != kind:
                raise errors.Conflict(f"model '{reg.id}' is registered as a {value.kind}, not a {kind}",
                                      param="model_name")
            if status == "exists" and replace:
                reg = await self.shared.bump_version(value)
            elif status == "exists":
                reg = value
        except redis.exceptions.RedisError as exc:
            raise _unreachable(self.settings, exc) from None
        if status == "full":
            raise errors.Unavailable(f"{self.settings.max_loaded_models} models are registered in the cluster "
                                     "(MAX_LOADED_MODELS) and none can be unloaded now (all still loading)",
                                     retry_after=5)
        if status == "added" and value:
            log.info("cluster cap %d reached: %s unregistered (least recently used)",
                     self.settings.max_loaded_models, value)
            self.wake()
        try:
            spec, already = await self._load_here(reg)
        except errors.ApiError:
            if status == "added":  # nobody else should keep trying a model that does not load
                await self._take_back(reg.id)
            raise
        await self._beat()
        return spec, already and status == "exists" and not replace

    async def _take_back(self, model_id_: str) -> None:
        try:
            await self.shared.unregister(model_id_, self.replica)
        except redis.exceptions.RedisError as exc:
            log.error("could not take back the failed registration of %s: %s", model_id_, exc)

    async def _load_here(self, reg: Registration) -> tuple[ModelSpec, bool]:
        """Load (or, for a newer version, replace) a registered model in this replica's Triton. A model
        registered again while its earlier unload still runs here waits for that unload (bounded), where the
        single-process registry answers 409: here the registration is already the cluster's decision."""
        key = (reg.model_name, reg.pretrained)
        deadline = time.monotonic() + self.settings.model_wait_s
        while (entry := self.entries.get(key)) is not None and entry.state == "unloading":
            if time.monotonic() > deadline:
                raise errors.Unavailable(f"model '{reg.id}' is still being unloaded on replica {self.replica}; "
                                         "retry later", retry_after=5, code="model_unloading")
            await asyncio.sleep(0.1)
        newer = entry is not None and entry.state == "ready" and self.versions.get(reg.id, 0) < reg.version
        try:
            spec, already = await super().load(reg.model_name, reg.pretrained, reg.kind, replace=newer)
        except errors.ApiError:
            self.failed[reg.id] = time.monotonic()  # the next attempt waits RETRY_FAILED_S (reconcile and requests)
            raise
        self.versions[reg.id] = max(reg.version, self.versions.get(reg.id, 0))
        self.failed.pop(reg.id, None)
        return spec, already

    async def _make_room(self, new: Entry) -> None:
        """The cap is the cluster's (the registration script): this replica loads what is registered."""

    async def unload(self, model_name: str, pretrained: str | None) -> ModelSpec | None:
        return await self._remove(model_name, pretrained, "unregister")

    async def delete(self, model_name: str, pretrained: str | None, kind: str | None = None) -> None:
        if model_name in self.builtin:
            return await super().delete(model_name, pretrained, kind)
        found = await self._registered(model_name, pretrained)
        if found is not None:
            self._deleted.add(found.id)
            await self._remove(found.model_name, found.pretrained, "delete")
        try:
            await super().delete(model_name, pretrained, kind)
        except errors.NotFound:
            if found is None:
                raise

    async def _remove(self, model_name: str, pretrained: str | None, op: str) -> ModelSpec | None:
        if model_name in self.builtin:
            return await super().unload(model_name, pretrained)
        found = await self._registered(model_name, pretrained)
        if found is not None:
            try:
                await self.shared.unregister(found.id, self.replica, op)
            except redis.exceptions.RedisError as exc:
                raise _unreachable(self.settings, exc) from None
            model_name, pretrained = found.model_name, found.pretrained
        here = self._find(model_name, pretrained)
        if isinstance(here, Entry) and here.state in ("ready", "loading"):
            try:
                return await super().unload(model_name, pretrained)
            except errors.NotFound:
                pass  # the reconcile unloaded it meanwhile
        elif found is None:
            raise errors.NotFound(f"model '{model_name}' is not loaded", param="model_name", code="model_not_found")
        await self._beat()
        return None

    async def _registered(self, model_name: str, pretrained: str | None) -> Registration | None:
        """The registration a name refers to (a CLIP registered with a tag may be named without it)."""
        name, pretrained = self.key(model_name, pretrained)
        try:
            found = await self.shared.get(model_id(name, pretrained))
            if found is None and pretrained is None:
                named = [r for r in (await self.shared.all()).values() if r.model_name == name]
                found = named[0] if len(named) == 1 else None
        except redis.exceptions.RedisError as exc:
            raise _unreachable(self.settings, exc) from None
        return found

    # ---- use ------------------------------------------------------------------------------------
    @asynccontextmanager
    async def use(self, model_name: str, pretrained: str | None = None) -> AsyncIterator[ModelSpec]:
        if model_name not in self.builtin and self._find(model_name, pretrained) is None:
            found = await self._registered(model_name, pretrained)
            if found is not None:  # registered, not loaded here yet: load it and wait (bounded)
                self._refuse_while_failed(found.id)
                await self._load_here(found)
        async with super().use(model_name, pretrained) as spec:
            yield spec

    def _refuse_while_failed(self, model_id_: str) -> None:
        """A 503 with Retry-After while the last load of the model here failed less than RETRY_FAILED_S ago."""
        failed = self.failed.get(model_id_)
        wait = RETRY_FAILED_S - (time.monotonic() - failed) if failed is not None else 0.0
        if wait > 0:
            raise errors.Unavailable(f"model '{model_id_}' failed to load on replica {self.replica} "
                                     f"{RETRY_FAILED_S - wait:.0f}s ago; it is tried again {RETRY_FAILED_S:g}s after "
                                     "a failure", retry_after=max(1, math.ceil(wait)), code="model_load_failed")

    # ---- where models are ready -----------------------------------------------------------------
    async def placement(self, model_id_: str, wait_all: bool = False) -> dict:
        deadline = time.monotonic() + self.settings.model_wait_s
        while True:
            try:
                live, where = await self.shared.live_replicas(), await self.shared.ready_on()
            except redis.exceptions.RedisError as exc:
                raise _unreachable(self.settings, exc) from None
            ready = sorted(set(where.get(model_id_, [])) & set(live))
            if not wait_all or set(live) <= set(ready) or time.monotonic() > deadline:
                return {"ready": len(ready), "live": len(live), "ready_on": ready}
            await asyncio.sleep(0.2)

    async def ready_on(self) -> dict[str, list[str]]:
        try:
            return await self.shared.ready_on()
        except redis.exceptions.RedisError:
            return await super().ready_on()

    async def pending(self) -> list[Registration]:
        """Registered in the cluster, not ready here (loading, or waiting for the next reconcile)."""
        ready = {model_id(*e.key) for e in self.entries.values() if e.state == "ready"}
        return [r for i, r in self.desired.items() if i not in ready]

    # ---- reconcile --------------------------------------------------------------------------------
    async def reconcile(self) -> None:
        """Load what is registered and missing here; unload what is here and no longer registered. The
        local snapshot is taken before Redis is read: a model that became ready here after a registration
        is then always in the registered set read afterwards (never unloaded by a stale read)."""
        here = {model_id(*e.key): e for e in self.entries.values()}
        self.desired = wanted = await self.shared.all()
        self.reconciles += 1
        self._deleted &= set(here)  # a delete's files go with its unload here; nothing here: nothing to do
        now = time.monotonic()
        loads = []
        for mid, reg in wanted.items():
            entry = here.get(mid)
            missing = entry is None
            stale = entry is not None and entry.state == "ready" and self.versions.get(mid, 0) < reg.version
            if (missing or stale) and now - self.failed.get(mid, -RETRY_FAILED_S) >= RETRY_FAILED_S:
                loads.append(self._reconcile_load(reg))
        removals = [self._reconcile_unload(mid, entry) for mid, entry in here.items()
                    if mid not in wanted and entry.state == "ready"]
        if loads or removals:
            await asyncio.gather(*loads, *removals)
            await self._beat()

    async def _reconcile_load(self, reg: Registration) -> None:
        try:
            await self._load_here(reg)
            log.info("reconcile: %s (version %d) ready on replica %s", reg.id, reg.version, self.replica)
        except errors.ApiError as exc:  # _load_here noted the failure: retried after RETRY_FAILED_S
            log.error("reconcile: loading the registered %s here failed: %s (retried in %.0fs)", reg.id,
                      exc.message, RETRY_FAILED_S)

    async def _reconcile_unload(self, mid: str, entry: Entry) -> None:
        if self.entries.get(entry.key) is not entry or entry.state != "ready":
            return
        try:
            await ModelRegistry.unload(self, *entry.key)
            log.info("reconcile: %s no longer registered: unloaded from replica %s", mid, self.replica)
        except errors.ApiError as exc:
            log.error("reconcile: unloading %s failed: %s", mid, exc.message)
            return
        self.versions.pop(mid, None)
        if mid in self._deleted:
            self._deleted.discard(mid)
            if entry.spec is not None:
                await asyncio.to_thread(modelgen.remove_generated, entry.key[0], entry.key[1], self.repository)

    async def _sync_loop(self) -> None:
        while not self._closing:
            await wait_event(self._wake, self.settings.cluster_sync_s)
            self._wake.clear()
            try:
                await self.reconcile()
            except Exception as exc:  # noqa: BLE001 - never let the loop die; the next round retries
                log.warning("reconcile failed: %s", exc)

    async def _listen(self) -> None:
        """Changes published by any replica wake the reconcile at once."""
        while not self._closing:
            pubsub = self.shared.redis.pubsub()
            try:
                await pubsub.subscribe(self.shared.channel)
                self.wake()  # events missed while not subscribed are caught up by one reconcile
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    try:
                        event = json.loads(message["data"])
                    except (TypeError, ValueError):
                        continue
                    if event.get("op") == "delete":
                        self._deleted.add(event.get("id"))
                    self.wake()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis gone: the periodic reconcile covers the gap
                log.warning("registry events: %s; subscribing again in 1s", exc)
                await asyncio.sleep(1)
            finally:
                try:
                    await pubsub.aclose()
                except Exception:  # noqa: BLE001
                    pass

    # ---- heartbeat ----------------------------------------------------------------------------
    async def _beat(self) -> None:
        ready = {model_id(*e.key) for e in self.entries.values() if e.state == "ready"} | set(self.builtin)
        now_wall, now_mono = time.time(), time.monotonic()
        used = {}
        for e in self.entries.values():
            mid = model_id(*e.key)
            if e.state == "ready" and self._flushed_use.get(mid) != e.last_used:
                used[mid] = now_wall - (now_mono - e.last_used)
                self._flushed_use[mid] = e.last_used
        try:
            await self.shared.heartbeat(self.replica, ready, used)
        except redis.exceptions.RedisError as exc:
            log.warning("heartbeat to the shared registry failed: %s", exc)

    async def _heartbeat_loop(self) -> None:
        while not self._closing:
            await self._beat()
            await asyncio.sleep(self.settings.cluster_heartbeat_s)
