"""The gateway app in this process, without Triton: a fake engine answers inference with zero vectors and
records what it was asked. Requests go through the real routes, middleware and error handlers (httpx's ASGI
transport) on the caller's own event loop: what bench/tracing_overhead.py times, and what the tests drive
(tests/inprocess_gateway.py adds their stubs of runtime model generation)."""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import httpx
import numpy as np

from gateway.app import create_app
from gateway.registry import ModelRegistry
from gateway.search.collections import Collections
from gateway.settings import Settings


class FakeEngine:
    def __init__(self):
        self.inferred: list[tuple[str, int]] = []  # (model, rows)
        self.loads: list[str] = []
        self.unloads: list[str] = []
        self.fail_load: set[str] = set()
        self.fail_unload = 0  # how many unload calls fail next

    async def infer(self, model, inputs, outputs, timeout_s=None):
        rows = len(next(iter(inputs.values())))
        self.inferred.append((model, rows))
        return {"embedding": np.ones((rows, 8), dtype=np.float32)}

    async def load(self, model: str, config: str | None = None) -> None:
        if model in self.fail_load:
            raise RuntimeError(f"fake Triton: {model} failed to load")
        self.loads.append(model)

    async def unload(self, model: str, unload_dependents: bool = False) -> None:
        await asyncio.sleep(0.01)  # a real unload yields: other requests run meanwhile
        if self.fail_unload:
            self.fail_unload -= 1
            raise RuntimeError(f"fake Triton: unloading {model} failed")
        self.unloads.append(model)

    async def ready(self, model: str) -> bool:
        return True

    async def repository_index(self) -> list[dict]:
        loaded = [m for m in self.loads if m not in self.unloads]
        return [{"name": m, "state": "READY"} for m in loaded]

    async def close(self) -> None:
        pass


@asynccontextmanager
async def inprocess_gateway(tmp_path, app_options: dict | None = None, **settings):
    """(app, client) with app.state.engine a FakeEngine; collections opened, models registry empty.
    `app_options`: create_app's other arguments (telemetry, tracer_provider)."""
    config = Settings(data_dir=tmp_path / "data", **settings)
    app = create_app(config, **(app_options or {}))
    engine = FakeEngine()
    app.state.engine, app.state.models = engine, ModelRegistry(config, engine)
    app.state.collections = Collections(config)
    app.state.collections.start()
    try:
        # a loopback Host, as a local client sends: without keys no other is served (DNS rebinding)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1",
                                     timeout=60) as client:
            yield app, client
    finally:
        app.state.collections.close()
        await app.state.models.close()
