"""`x-replica-id` on every response, as one plain ASGI middleware: behind a load balancer (`make cluster`)
a client, a test or an operator sees which replica answered. The id is `REPLICA_ID`, else the host name
(a Kubernetes pod's name).

`install` puts it outside everything the app builds, Starlette's ServerErrorMiddleware included, so the
admission 503s, the 401s and even an unexpected 500 carry it. A response uvicorn writes itself without
calling the app (a malformed request line, `limit_concurrency`'s 503) does not."""
from __future__ import annotations

import os
import re
import socket

HEADER = b"x-replica-id"
_UNSAFE = re.compile(r"[^\x21-\x7e]")  # one visible-ASCII token: nothing that could split or fold a header


def replica_id(env: dict[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    value = _UNSAFE.sub("", env.get("REPLICA_ID", "").strip())[:128]
    return value or _UNSAFE.sub("", socket.gethostname())[:128] or "unknown"


class ReplicaId:
    def __init__(self, app, replica: str | None = None):
        self.app = app
        self.value = (replica or replica_id()).encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": headers + [(HEADER, self.value)]}
            await send(message)

        await self.app(scope, receive, send_with_id)


def install(app, replica: str | None = None) -> None:
    """Wraps the app's whole middleware stack (built lazily on the first request): outermost of all."""
    build = app.build_middleware_stack
    value = replica or replica_id()
    app.build_middleware_stack = lambda: ReplicaId(build(), value)
