"""Without a server: the watch closes the gateway while Triton is down and re-loads the registry's models
into a new server before their requests are admitted again; the admission middleware refuses with 503
while down or draining, lets requests in flight finish, and ends those left at the drain deadline with
an explicit error (a 503, or a final error event on a stream)."""
from __future__ import annotations

import asyncio
import json

import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from gateway.middleware import admission as admission_module
from gateway import errors
from gateway.middleware.admission import Admission
from gateway.registry import ModelRegistry
from gateway.triton.server_watch import ServerWatch
from gateway.settings import Settings
from test_gateway_registry import FakeEngine, generated  # noqa: F401 - the fixture


class FakeServer(FakeEngine):
    """A Triton that can die and come back empty (explicit mode: only what its command line loads)."""

    def __init__(self):
        super().__init__()
        self.url, self.is_live, self.models = "127.0.0.1:1", True, set()

    async def live(self) -> bool:
        return self.is_live

    async def load(self, model: str) -> None:
        await super().load(model)
        self.models.add(model)

    async def repository_index(self) -> list[dict]:
        return [{"name": m, "state": "READY"} for m in self.models]

    def restart(self):
        self.models = set()


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


def test_down_then_a_new_server_reloads_held_models_before_admitting(tmp_path, generated):  # noqa: F811
    async def main():
        server = FakeServer()
        reg = ModelRegistry(Settings(data_dir=tmp_path / "data"), server)
        admission = Admission()
        watch = ServerWatch(server, reg, admission)
        spec, _ = await reg.load("m/a", None, "sentence_transformer")
        await watch.check_once()
        assert admission.refusal() is None and watch.problems() == {}
        server.is_live = False
        await watch.check_once()
        refusal = admission.refusal()
        # issue 43: a 503 (the refusal, /health's problems) names no internal address; the log does
        assert isinstance(refusal, errors.Unavailable) and refusal.code == "server_unavailable"
        assert server.url not in refusal.message and server.url not in str(watch.problems())
        assert refusal.headers()["Retry-After"] and "triton" in watch.problems()
        server.restart()
        server.is_live = True
        server.gate.clear()  # the reload waits: the model must be refused meanwhile
        await watch.check_once()
        assert admission.refusal() is None  # the server is back: shipped models serve
        assert reg.loaded() == reg.loaded()[:1] and [s.model_name for s in reg.reloading()] == ["m/a"]
        assert list(watch.problems()) == ["m/a"]
        with pytest.raises(errors.Unavailable):
            async with reg.use("m/a"):
                pass
        server.gate.set()
        await watch._resync
        assert spec.text_model in server.models and watch.problems() == {} and not reg.reloading()
        async with reg.use("m/a") as used:
            assert used is spec
        assert watch.resyncs[-1]["entries"] == ["m/a"]
        assert json.loads(reg.state_file.read_text())[0]["model_name"] == "m/a"
    run(main())


def test_a_model_the_server_lost_without_a_down_poll_is_reloaded(tmp_path, generated):  # noqa: F811
    """The kubelet restarted Triton between two polls: the model is missing from a live server."""
    async def main():
        server = FakeServer()
        reg = ModelRegistry(Settings(data_dir=tmp_path / "data"), server)
        watch = ServerWatch(server, reg, Admission())
        await reg.load("m/a", None, "sentence_transformer")
        server.restart()
        await watch.check_once()  # once could be a reload's instant
        assert not reg.reloading()
        await watch.check_once()
        assert reg.reloading()
        await watch._resync
        assert not reg.reloading() and len(server.models) == 1
    run(main())


def app_with(admission: Admission, release: asyncio.Event) -> FastAPI:
    app = FastAPI()
    app.add_middleware(admission_module.Admit, admission=admission)

    @app.get("/slow")
    async def slow():
        await release.wait()
        return {"ok": True}

    @app.get("/stream")
    async def stream():
        async def events():
            yield "data: first\n\n"
            await asyncio.Event().wait()  # never ends on its own
        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    return app


async def call(app, path: str) -> list[dict]:
    """Drive the ASGI app like a server would; the messages it sends."""
    sent: list[dict] = []
    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [], "http_version": "1.1", "scheme": "http", "server": ("t", 80), "client": ("c", 1),
             "root_path": ""}

    async def receive():
        await asyncio.Event().wait()

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    return sent


def status(messages) -> int:
    return next(m["status"] for m in messages if m["type"] == "http.response.start")


def body(messages) -> bytes:
    return b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")


def test_drain_finishes_requests_in_flight_refuses_new_ones_and_ends_streams_with_an_error():
    async def main():
        admission, release = Admission(drain_s=1.0), asyncio.Event()
        app = app_with(admission, release)
        slow = asyncio.ensure_future(call(app, "/slow"))
        stream = asyncio.ensure_future(call(app, "/stream"))
        await asyncio.sleep(0.2)
        drain = asyncio.ensure_future(admission.drain())
        await asyncio.sleep(0.1)
        refused = await call(app, "/slow")
        assert status(refused) == 503 and b"shutting_down" in body(refused)
        assert any(k == b"retry-after" for k, _ in refused[0]["headers"])
        assert status(await call(app, "/health")) == 200  # always answered (it says 503 itself in the gateway)
        release.set()
        assert status(await slow) == 200  # finished within the deadline
        await drain
        messages = await stream
        assert status(messages) == 200 and body(messages).startswith(b"data: first\n\n")
        last = body(messages).split(b"\n\n")[-2]
        assert last.startswith(b"data: ") and json.loads(last[6:])["error"]["code"] == "shutting_down"
        assert admission.cut_count == 1 and not admission.active
    run(main())


def test_a_request_without_an_answer_at_the_deadline_gets_a_503():
    async def main():
        admission = Admission(drain_s=0.3)
        app = app_with(admission, asyncio.Event())  # never released
        slow = asyncio.ensure_future(call(app, "/slow"))
        await asyncio.sleep(0.1)
        await admission.drain()
        messages = await slow
        assert status(messages) == 503 and b"drain deadline" in body(messages)
    run(main())


def test_requests_are_refused_while_the_server_is_down():
    async def main():
        admission = Admission()
        admission.server_problem = "the Triton server at x is not live (restarting); retry later"
        app = app_with(admission, asyncio.Event())
        messages = await call(app, "/slow")
        assert status(messages) == 503 and b"server_unavailable" in body(messages)
    run(main())


def test_a_gateway_started_before_triton_waits_for_it_before_loading_its_models(tmp_path, generated):  # noqa: F811
    async def main():
        settings = Settings(data_dir=tmp_path / "data", preload_models=("st:m/a",))
        server = FakeServer()
        server.is_live = False
        reg = ModelRegistry(settings, server)
        starting = asyncio.ensure_future(reg.start())
        await asyncio.sleep(1.0)
        assert not starting.done() and not server.loads  # waiting, not failing
        server.is_live = True
        await starting
        assert [s.model_name for s in reg.loaded() if not s.builtin] == ["m/a"]
    run(main())
