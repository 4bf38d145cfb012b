"""Audit of admin actions (issue 25), as one ASGI middleware: every request to an admin route (loading,
unloading, deleting models; creating and deleting collections; writing and deleting points) is one JSON
line in DATA_DIR/audit.log and in the gateway log: time, key id, route, target, result, request id.
Refused requests (401, 403, 413, 429, and 503 while Triton is down or the gateway drains: audit runs
before admission) are audited too: they are attempts."""
from __future__ import annotations

import json
import logging
import os
import threading
from datetime import datetime, timezone
from pathlib import Path

from gateway.middleware import strict_json
from gateway.middleware.auth import KEY_SCOPE, REQUEST_ID
from gateway.middleware.policy import SMALL, RouteTable

log = logging.getLogger("gateway.audit")
# An admin body is kept whole, as the route reads it, to name the target model: the route validates the
# same bytes through the same parser (strict_json), so the audit line names what the route acted on,
# whatever the body's size or field order (the first 4 KiB alone missed a padded unload: issue 56). The
# routes that name their target in the body take SMALL bodies (policy.py; larger ones are 413s), so no more
# is ever held; the collections' routes name it in the path and their bodies (points) are not kept.
KEEP = SMALL


def target_of(params: dict, body: bytes) -> str | None:
    """The collection in the path, or the model named in the body. Never raises: it runs after the answer
    was sent, where an exception loses the audit line and makes uvicorn drop the keep-alive connection
    (the client's next request on it fails; seen with JSON nested 5,000 deep)."""
    if params.get("name"):
        return str(params["name"])
    try:
        data = strict_json.loads(body)
    except ValueError:
        return None
    if isinstance(data, dict) and isinstance(data.get("model_name"), str):
        name = data["model_name"][:256]
        return f"{name}|{data['pretrained']}" if isinstance(data.get("pretrained"), str) else name
    return None


class AuditLog:
    def __init__(self, path: Path):
        self.path, self._lock = Path(path), threading.Lock()

    def write(self, record: dict) -> None:
        # ASCII JSON: a client's text (request id, target) cannot break the line or forge another (issue 43)
        line = json.dumps(record, separators=(",", ":"))
        log.info("audit %s", line)
        try:
            with self._lock:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, (line + "\n").encode())
                finally:
                    os.close(fd)
        except OSError as exc:
            # the answer is sent already: raising here would only make uvicorn drop the connection; the
            # line is in the gateway log (above), and this says the file lacks it
            log.error("audit line not written to %s (%s): %s", self.path, exc, line)


class Audit:
    """Outside auth and admission, so that a 401, 403 or 503 is recorded as well."""

    def __init__(self, app, routes: RouteTable, audit_log: AuditLog):
        self.app, self.routes, self.audit_log = app, routes, audit_log

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, policy = self.routes.resolve(scope)
        if not policy.audit:
            return await self.app(scope, receive, send)
        params = scope.get("gateway.path_params", {})
        body, status, written = bytearray(), 500, False
        keep = 0 if params.get("name") else KEEP  # the path names the target: nothing to keep

        def record() -> None:
            nonlocal written
            if written:
                return
            written = True
            key = scope.get(KEY_SCOPE)
            self.audit_log.write({
                "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                "key_id": key.key_id if key is not None else None,
                "route": f"{scope['method']} {path}",
                "target": target_of(params, bytes(body)),
                "result": status,
                "request_id": scope.get(REQUEST_ID)})

        async def keeping_receive():
            message = await receive()
            if keep and message["type"] == "http.request" and len(body) <= keep:
                body.extend(message.get("body", b"")[:keep + 1 - len(body)])  # over KEEP: not a body routes read
            return message

        async def noting_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                # written before the answer's last byte leaves: a client that has its answer finds the
                # line (written after, a client reading audit.log at once could miss it: CI saw that)
                record()
            await send(message)

        try:
            await self.app(scope, keeping_receive, noting_send)
        finally:
            record()  # no answer finished (an exception, a client gone): the attempt is still recorded
