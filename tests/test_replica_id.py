"""`x-replica-id` (gateway/middleware/replica_id.py) on every response of the real app: a success, a 404, an admission
503 (draining, Triton down), a 401 from the keys, and an unexpected 500 from Starlette's error handler.
The id comes from REPLICA_ID, else the host name, and never carries characters that could split a header."""
from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from gateway.app import create_app
from gateway.middleware.replica_id import replica_id
from gateway.settings import Settings
from inprocess_gateway import FakeEngine
from security_helpers import write_keys


def client_for(app) -> httpx.AsyncClient:
    # raise_app_exceptions=False: the 500 the app's own error handler answers reaches the client as it would
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                             base_url="http://127.0.0.1", timeout=30)


def make_app(tmp_path, **settings):
    app = create_app(Settings(data_dir=tmp_path / "data", **settings))
    app.state.engine = FakeEngine()
    return app


def test_the_id_comes_from_replica_id_else_the_host_name():
    assert replica_id({"REPLICA_ID": "replica-1"}) == "replica-1"
    assert replica_id({}) == socket.gethostname()
    assert replica_id({"REPLICA_ID": "  "}) == socket.gethostname()
    assert replica_id({"REPLICA_ID": "a b\r\nx-evil: 1"}) == "abx-evil:1"  # no space, CR or LF survives


def test_every_kind_of_response_carries_the_id(tmp_path, monkeypatch):
    monkeypatch.setenv("REPLICA_ID", "replica-7")
    app = make_app(tmp_path)

    @app.get("/boom", include_in_schema=False)
    async def boom():
        raise RuntimeError("unexpected")

    async def run():
        async with client_for(app) as client:
            seen = {}
            seen["openapi"] = await client.get("/openapi.json")
            seen["404"] = await client.get("/no-such-route")
            seen["500"] = await client.get("/boom")
            app.state.admission.server_problem = "Triton at 127.0.0.1:1 is not live"
            seen["503 server"] = await client.post("/v1/embeddings", json={"model": "m", "input": ["x"]})
            app.state.admission.server_problem = None
            app.state.admission.draining = True
            seen["503 draining"] = await client.post("/v1/embeddings", json={"model": "m", "input": ["x"]})
            return seen

    seen = asyncio.run(run())
    assert seen["openapi"].status_code == 200
    assert seen["404"].status_code == 404
    assert seen["500"].status_code == 500
    assert seen["503 server"].status_code == 503 and seen["503 draining"].status_code == 503
    assert "shutting down" in seen["503 draining"].text
    for name, response in seen.items():
        assert response.headers.get_list("x-replica-id") == ["replica-7"], name


def test_a_401_from_the_keys_carries_the_id(tmp_path, monkeypatch):
    monkeypatch.delenv("REPLICA_ID", raising=False)
    app = make_app(tmp_path, api_keys_file=write_keys(tmp_path / "keys"))

    async def run():
        async with client_for(app) as client:
            return await client.post("/v1/embeddings", json={"model": "m", "input": ["x"]})

    response = asyncio.run(run())
    assert response.status_code == 401
    assert response.headers["x-replica-id"] == socket.gethostname()


@pytest.mark.parametrize("scope_type", ["lifespan", "websocket"])
def test_other_scopes_pass_through_untouched(scope_type):
    from gateway.middleware.replica_id import ReplicaId

    seen = []

    async def inner(scope, receive, send):
        seen.append(scope["type"])
        await send({"type": "x"})

    sent = []

    async def send(message):
        sent.append(message)

    asyncio.run(ReplicaId(inner, "r")({"type": scope_type}, None, send))
    assert seen == [scope_type] and sent == [{"type": "x"}]
