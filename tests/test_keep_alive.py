"""Issue 55: connections that pooled clients can keep. The gateway's uvicorn options (gateway/__main__.py) keep an
idle connection across a 30 s gap (client pools keep theirs 5-15 s, so the client closes first and never sends
into a connection the gateway is closing); while the gateway drains, its answers say `Connection: close`."""
from __future__ import annotations

import asyncio
import socket
import threading
import time

import uvicorn

from gateway.__main__ import server_config
from gateway.middleware.admission import Admission, Admit
from gateway.settings import Settings
from launcher.processes import free_port


async def hello(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def exchange(sock: socket.socket) -> bytes:
    sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    data = b""
    while not data.endswith(b"ok"):
        chunk = sock.recv(4096)
        if not chunk:
            return data  # closed by the server
        data += chunk
    return data


def test_an_idle_connection_is_kept_across_a_30_s_gap():
    port = free_port()
    server = uvicorn.Server(server_config(Settings(port=port), hello))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            assert exchange(sock).startswith(b"HTTP/1.1 200")
            time.sleep(30)
            again = exchange(sock)  # the same connection, 30 s later: answered, not closed
            assert again.startswith(b"HTTP/1.1 200"), again
            assert b"connection: close" not in again.lower()
    finally:
        server.should_exit = True
        thread.join(30)


def test_answers_while_draining_say_connection_close():
    async def scenario():
        admission = Admission(drain_s=5)
        sent: list[dict] = []

        async def send(message):
            sent.append(message)

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def inner(scope, receive, send):
            admission.draining = True  # the drain starts while this request runs
            await hello(scope, receive, send)

        scope = {"type": "http", "path": "/v1/embeddings", "method": "POST", "headers": []}
        await Admit(inner, admission)(scope, receive, send)  # admitted before the drain
        await Admit(inner, admission)(scope, receive, send)  # refused: the gateway drains
        return [m for m in sent if m["type"] == "http.response.start"]

    started = asyncio.run(scenario())
    assert [m["status"] for m in started] == [200, 503]
    assert all((b"connection", b"close") in m["headers"] for m in started)
