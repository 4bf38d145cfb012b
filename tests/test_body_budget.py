"""BODY_BUFFER_BYTES (issue 25): request bodies together hold at most the budget; a body that does not fit
now gets 503 in the error shape before more of it is read, one larger than the whole budget gets 413,
and every request gives its bytes back when it ends (answered, refused or cancelled). The middleware is
called directly, around an app that holds each body until told to answer, as a route waiting on Triton."""
from __future__ import annotations

import asyncio
import json

import pytest

from gateway.middleware.body_budget import DEFAULT_BUDGET, BodyBudget, budget_bytes
from gateway.middleware.body_limits import CapBodies
from gateway.middleware.policy import RouteTable
from gateway.settings import Settings

KIB = 1024
PIECE = b"x" * (16 * KIB)


def test_budget_arithmetic():
    budget = BodyBudget(100)
    assert budget.take(60) and not budget.take(41) and budget.take(40) and budget.used == 100
    budget.give(60)
    assert budget.used == 40 and budget.take(60) and not budget.take(1)


def test_budget_setting():
    assert budget_bytes(Settings.from_env({})) == DEFAULT_BUDGET == 44 << 20
    assert budget_bytes(Settings.from_env({"BODY_BUFFER_BYTES": "1000"})) == 1000
    with pytest.raises(ValueError, match="BODY_BUFFER_BYTES"):
        budget_bytes(Settings.from_env({"BODY_BUFFER_BYTES": "0"}))


class Holder:
    """The app: reads the whole body as Starlette does, then holds it until `release` is set."""

    def __init__(self):
        self.release = asyncio.Event()
        self.bodies: list[int] = []

    async def __call__(self, scope, receive, send):
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.bodies.append(len(body))
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


class Client:
    """One request: its body in PIECE-sized messages, fed only as the app asks for them."""

    def __init__(self, size: int, chunked: bool = True, path: str = "/v1/embeddings"):
        headers = [(b"content-type", b"application/json")]
        if not chunked:
            headers.append((b"content-length", str(size).encode()))
        self.scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
        self.left, self.read = size, 0
        self.messages: list[dict] = []

    async def receive(self):
        piece = PIECE[:self.left]
        self.left -= len(piece)
        self.read += len(piece)
        await asyncio.sleep(0)  # other requests run between pieces
        return {"type": "http.request", "body": piece, "more_body": self.left > 0}

    async def send(self, message):
        self.messages.append(message)

    @property
    def status(self) -> int | None:
        return next((m["status"] for m in self.messages if m["type"] == "http.response.start"), None)

    def error(self) -> dict:
        start = next(m for m in self.messages if m["type"] == "http.response.start")
        body = b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")
        return {"headers": {k.decode(): v.decode() for k, v in start["headers"]}, **json.loads(body)["error"]}


def middleware(budget: int) -> tuple[CapBodies, Holder]:
    holder = Holder()
    return CapBodies(holder, RouteTable(None), Settings(), BodyBudget(budget)), holder


async def until(condition, timeout: float = 10.0):
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.001)


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
def test_bodies_over_the_budget_wait_their_turn_with_503(chunked):
    async def scenario():
        cap, holder = middleware(budget=256 * KIB)
        held = [Client(96 * KIB, chunked) for _ in range(2)]  # 192 KiB of 256 held by requests in flight
        tasks = [asyncio.create_task(cap(c.scope, c.receive, c.send)) for c in held]
        await until(lambda: len(holder.bodies) == 2)
        assert cap.budget.used == 192 * KIB
        late = Client(96 * KIB, chunked)
        await cap(late.scope, late.receive, late.send)  # answered at once: nothing to wait for
        assert late.status == 503
        error = late.error()
        assert error["type"] == "service_unavailable_error" and error["code"] == "body_buffer_full"
        assert "BODY_BUFFER_BYTES" in error["message"] and error["headers"]["retry-after"] == "1"
        assert error["headers"]["connection"] == "close"
        # not read past the budget: chunked, 64 KiB fitted and the next piece was refused; declared, nothing
        assert late.read == (80 * KIB if chunked else 0)
        assert cap.budget.used == 192 * KIB  # the refused request gave back what it had taken
        holder.release.set()
        await asyncio.gather(*tasks)
        assert [c.status for c in held] == [200, 200] and cap.budget.used == 0
        again = Client(96 * KIB, chunked)
        await cap(again.scope, again.receive, again.send)
        assert again.status == 200 and cap.budget.used == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
def test_a_body_larger_than_the_whole_budget_is_413(chunked):
    """/v1/embeddings' own cap is 16 MiB; a 512 KiB budget is the ceiling: such a body could never fit."""
    async def scenario():
        cap, _holder = middleware(budget=512 * KIB)
        client = Client(600 * KIB, chunked)
        cap.app.release.set()
        await cap(client.scope, client.receive, client.send)
        return cap, client

    cap, client = asyncio.run(scenario())
    assert client.status == 413 and str(512 * KIB) in client.error()["message"]
    assert client.read <= 512 * KIB + len(PIECE) and cap.budget.used == 0


def test_a_cancelled_request_gives_its_bytes_back():
    """A client that disconnects mid-body (uvicorn cancels nothing, but a drain deadline does)."""
    async def scenario():
        cap, holder = middleware(budget=1024 * KIB)
        client = Client(200 * KIB)
        task = asyncio.create_task(cap(client.scope, client.receive, client.send))
        await until(lambda: holder.bodies)
        assert cap.budget.used == 200 * KIB
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return cap

    assert asyncio.run(scenario()).budget.used == 0


def test_the_route_cap_still_applies_under_the_budget():
    async def scenario():
        cap, holder = middleware(budget=64 << 20)
        client = Client(200 * KIB, path="/unload_model")  # cap 64 KiB
        holder.release.set()
        await cap(client.scope, client.receive, client.send)
        return cap, client

    cap, client = asyncio.run(scenario())
    assert client.status == 413 and client.error()["code"] == "body_too_large" and cap.budget.used == 0


# --- what a refused or abandoned body leaves behind, through the real app ---

INFERENCE = "gk-inference-0123456789"


def traced_after(tmp_path, messages, occupied: int = 0) -> tuple[int | None, float]:
    """(status sent, MiB still allocated once the request has ended) for one POST /v1/embeddings whose
    receive() gives `messages`, the cyclic GC off: what only it would free counts as held. `occupied`:
    bytes of the body budget (BODY_BUFFER_BYTES) other requests hold meanwhile."""
    import gc
    import tracemalloc

    from gateway.app import create_app
    from gateway.keys import key_line

    (tmp_path / "keys").write_text(key_line(INFERENCE, "inference-1", "inference"))
    app = create_app(Settings(data_dir=tmp_path, api_keys_file=tmp_path / "keys", max_body_bytes=4 << 20))
    budget, others = app.state.body_budget, 0
    while occupied > 0:  # held by other keys, each up to its share (BODY_BUFFER_KEY_BYTES)
        assert budget.take(min(occupied, budget.share), f"other-{others}")
        occupied, others = occupied - budget.share, others + 1

    async def request(feed) -> int | None:
        sent = []
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/embeddings", "raw_path": b"/v1/embeddings", "query_string": b"",
                 "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "state": {},
                 "headers": [(b"authorization", f"Bearer {INFERENCE}".encode()),
                             (b"content-type", b"application/json")]}
        feed = iter(feed)

        async def receive():
            await asyncio.sleep(0)
            return next(feed)

        async def send(message):
            sent.append(message)

        await app(scope, receive, send)
        return next((m["status"] for m in sent if m["type"] == "http.response.start"), None)

    asyncio.run(request(messages()))  # warm: first-use allocations are not the request's
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        status = asyncio.run(request(messages()))
        return status, (tracemalloc.get_traced_memory()[0] - base) / 2**20
    finally:
        tracemalloc.stop()
        gc.enable()


def pieces(count: int, then: dict | None = None):
    def messages():
        for _ in range(count):
            yield {"type": "http.request", "body": bytes(64 * KIB), "more_body": True}
        if then is not None:
            yield then
    return messages


@pytest.mark.parametrize("case", ["over the cap", "over the budget", "client gone"])
def test_a_failed_body_read_frees_its_chunks_at_once(tmp_path, case):
    """FastAPI keeps the exception of a failed body read in a reference cycle that reaches the chunks
    Starlette had read: without help they waited for the cyclic GC (4 MiB here, per request)."""
    if case == "over the cap":
        status, held = traced_after(tmp_path, pieces(80))  # 5 MiB chunked, cap 4 MiB
        assert status == 413
    elif case == "over the budget":
        status, held = traced_after(tmp_path, pieces(80), occupied=DEFAULT_BUDGET - (3 << 20))
        assert status == 503  # 3 MiB of the budget left, under the 4 MiB cap
    else:
        status, held = traced_after(tmp_path, pieces(60, {"type": "http.disconnect"}))
        assert status == 400  # FastAPI's answer to a failed read, sent to nobody
    assert held < 1.0, f"{held:.1f} MiB still held after the request"

