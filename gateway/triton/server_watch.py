"""The gateway's view of the Triton server underneath, kept true when the server dies and comes back.

A poll every `period_s` of each server (one per failure domain: gateway/triton/domains.py): while every server is
down, gateway/middleware/admission.py refuses every request with a 503 (naming no address); while one of two is
down, only its models' calls fail (a 503 from the engine) and the other domain serves on. A new server (one
seen after a down period, or one that no longer has a model the gateway holds: the kubelet restarted the
`triton` container between two polls) has only what its
command line loads, so every runtime-registered and preloaded model the registry holds is loaded
again, from the folders the gateway generated (DATA_DIR/triton_models, Triton's second repository).
Until its own reload is done, each such model answers 503 and is listed as reloading, not as loaded."""
from __future__ import annotations

import asyncio
import logging
import time

from gateway import errors
from gateway.middleware.admission import Admission
from gateway.triton.domains import ENCODERS, health_key, servers_of

log = logging.getLogger("gateway.server_watch")


class ServerWatch:
    def __init__(self, engine, registry, admission: Admission, period_s: float = 0.5):
        self.engine, self.registry, self.admission, self.period_s = engine, registry, admission, period_s
        self.down: dict[str, float] = {}  # domain -> monotonic time its server was seen down
        self.suspects: dict = {}  # entry -> polls in a row its models were not READY on a live server
        self.resyncs: list[dict] = []  # {"entries", "started", "done", "seconds"}: for logs and tests
        self._poke = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._resync: asyncio.Task | None = None
        registry.on_lost = self.poke

    def start(self) -> "ServerWatch":
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def close(self) -> None:
        for task in (self._task, self._resync):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def poke(self) -> None:
        """Check now (a request saw the server or a model gone)."""
        self._poke.set()

    @property
    def down_since(self) -> float | None:
        """When the main server (the registry's models) went down; None while it is live."""
        return self.down.get(ENCODERS)

    def problems(self) -> dict[str, str]:
        """For /health: each server that is down (`triton`, `triton_codegen`: no address), and each model that is
        being loaded again."""
        problems = {health_key(domain): "the Triton server is not live (restarting)" for domain in self.down}
        if self.down_since is not None:
            return problems
        return problems | {entry.label: "reloading into the restarted Triton server"
                           for entry in self.registry.entries.values() if entry.state == "resyncing"}

    async def _run(self) -> None:
        while True:
            try:
                await self.check_once()
            except Exception as exc:  # noqa: BLE001 - never let the watch die; the next poll retries
                log.warning("server check failed: %s", exc)
            try:  # not asyncio.wait_for: on 3.11 it can swallow close()'s cancel (gateway/registry/)
                async with asyncio.timeout(self.period_s):
                    await self._poke.wait()
            except TimeoutError:
                pass
            self._poke.clear()

    async def check_once(self) -> None:
        servers = servers_of(self.engine)
        live = dict(zip(servers, await asyncio.gather(*(engine.live() for engine in servers.values()))))
        for domain, engine in servers.items():
            if not live[domain] and domain not in self.down:
                self.down[domain] = time.monotonic()
                log.warning("Triton server (%s) at %s is down: its models' requests get 503 until it is back",
                            domain, engine.url)
            elif live[domain] and domain != ENCODERS and domain in self.down:
                log.warning("Triton server (%s) is back after %.1fs", domain, time.monotonic() - self.down.pop(domain))
        if not any(live.values()):  # nothing can serve: the gate closes (a single server's outage included)
            # what /health answers: no internal address (the log line above names it)
            self.admission.server_problem = "the Triton server is not live (restarting); retry later"
            return
        if not live[ENCODERS]:  # the other domain serves; the registry's models (there) wait for their server
            self.admission.server_problem = None
            return
        held = [e for e in self.registry.entries.values() if e.state == "ready" and e.spec is not None]
        ready = {m.get("name") for m in await self.engine.repository_index()
                 if m.get("state") == "READY"} if held else set()
        lost = []
        for entry in held:
            if all(m in ready for m in entry.spec.ensembles):
                self.suspects.pop(entry, None)
                continue
            # a model missing after a down period is gone; otherwise twice in a row (not a reload's instant)
            self.suspects[entry] = self.suspects.get(entry, 0) + 1
            if self.down_since is not None or self.suspects[entry] >= 2:
                lost.append(entry)
        for entry in lost:  # before the gate opens: no request reaches a model that is not there yet
            self.suspects.pop(entry, None)
            entry.state = "resyncing"
        if self.down_since is not None:
            log.warning("Triton server is back after %.1fs", time.monotonic() - self.down.pop(ENCODERS))
        self.admission.server_problem = None
        if lost:
            log.warning("the Triton server lost %d of the gateway's models (a restart): loading them again: %s",
                        len(lost), ", ".join(e.label for e in lost))
        if any(e.state == "resyncing" for e in self.registry.entries.values()) and \
                (self._resync is None or self._resync.done()):
            self._resync = asyncio.get_running_loop().create_task(self._reload_all())

    async def _reload_all(self) -> None:
        """Every held model at once (Triton loads them on its own threads); each one serves as soon as its
        own reload is done. A failure leaves it reloading: the next poll retries (the server may be gone)."""
        started = time.monotonic()
        todo = [e for e in self.registry.entries.values() if e.state == "resyncing"]
        done = await asyncio.gather(*(self._reload(entry) for entry in todo))
        self.resyncs.append({"entries": [e.label for e, ok in zip(todo, done) if ok],
                             "seconds": time.monotonic() - started, "done": time.time()})

    async def _reload(self, entry) -> bool:
        t0 = time.monotonic()
        try:
            for ensemble in entry.spec.ensembles:  # Triton loads an ensemble's composing models with it
                await self.engine.load(ensemble)
        except errors.ApiError as exc:
            log.warning("reloading %s failed (%s): retried on the next check", entry.label, exc.message)
            return False
        if entry.state == "resyncing":  # not unloaded meanwhile
            entry.state = "ready"
            entry.idle.set()
        log.warning("re-sync: %s serves again (reloaded in %.1fs)", entry.label, time.monotonic() - t0)
        return True
