"""Authentication and scopes (issue 25), as one ASGI middleware that answers before any body is read.

A key comes as `Authorization: Bearer <key>` (what the `openai` SDK sends) or `x-api-key: <key>`.
No key or an unknown one: 401 with `WWW-Authenticate: Bearer`; a key without the route's scope: 403;
both in OpenAI's error shape. Open routes (`/health`, `/metrics/prometheus`, the docs) need no key.
Without GATEWAY_API_KEYS_FILE the gateway is open, which it only allows on a loopback HOST, and then it
serves loopback Host and Origin values only (local_origin.py: DNS rebinding). It runs before admission
(gateway/middleware/__init__.py): an unknown key gets 401 whatever the server's state."""
from __future__ import annotations

import logging
import uuid

from gateway import errors
from gateway.keys import KeyRing
from gateway.middleware.local_origin import LocalOrigin
from gateway.middleware.log_fields import printable
from gateway.middleware.policy import RouteTable
from gateway.settings import Settings
from gateway.loopback import is_loopback

log = logging.getLogger("gateway.auth")
KEY_SCOPE = "gateway.key"  # the ApiKey of the request, for the quota and audit middlewares
REQUEST_ID = "gateway.request_id"


def admin_key_required(settings: Settings) -> bool:
    """True when loading models (and every other admin route) needs a key with the `admin` scope, i.e.
    when keys are configured. Without keys the gateway only starts on a loopback HOST (`check_exposure`),
    so a False here means: only local callers can reach the admin routes."""
    return settings.api_keys_file is not None


def check_exposure(settings: Settings) -> KeyRing | None:
    """The key ring, or None for an open gateway on loopback; an open gateway off loopback is refused."""
    if settings.api_keys_file is not None:
        ring = KeyRing.from_file(settings.api_keys_file)
        if not ring.keys:
            raise RuntimeError(f"GATEWAY_API_KEYS_FILE={settings.api_keys_file} holds no key: every route but "
                               "/health and /metrics/prometheus would refuse every caller")
        log.warning("gateway: API keys required (%d keys from %s)", len(ring.keys), settings.api_keys_file)
        return ring
    if not is_loopback(settings.host):
        raise RuntimeError(f"HOST={settings.host!r} is not loopback and GATEWAY_API_KEYS_FILE is not set: refusing "
                           "to serve every route to anyone who can reach the port (`make triton` generates an "
                           "admin key; docs/security.md)")
    log.warning("gateway: no API keys (GATEWAY_API_KEYS_FILE unset) and HOST=%s is loopback: every route is open "
                "to local callers", settings.host)
    return None


def presented_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
        elif name == b"x-api-key" and value.strip():
            return value.decode("latin-1").strip()
    return None


def request_id(headers: list[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name == b"x-request-id" and 0 < len(value) <= 128:
            return value.decode("latin-1")
    return uuid.uuid4().hex


class Authenticate:
    """`local_origin`: the Host and Origin check of an open gateway (None with keys)."""

    def __init__(self, app, routes: RouteTable, ring: KeyRing | None, local_origin: LocalOrigin | None = None):
        self.app, self.routes, self.ring = app, routes, ring
        self.local_origin = local_origin if ring is None else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = scope[REQUEST_ID] = request_id(scope["headers"])
        path, policy = self.routes.resolve(scope)

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", rid.encode("latin-1"))]
            await send(message)

        if self.ring is None:
            refused = self.local_origin.refusal(scope["headers"]) if self.local_origin is not None else None
            if refused is not None:
                log.info("403 %s %s: %s (request %s)", scope["method"], printable(path or scope["path"]),
                         refused.code, printable(rid))
                return await errors.send(send_with_id, refused)
            return await self.app(scope, receive, send_with_id)
        if policy.scope is None:
            return await self.app(scope, receive, send_with_id)
        presented = presented_key(scope["headers"])
        key = self.ring.find(presented) if presented is not None else None
        if key is None:
            message = ("no API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'" if presented is None
                       else "the API key is not valid")
            log.info("401 %s %s: %s (request %s)", scope["method"], printable(path or scope["path"]),
                     "no key" if presented is None else "unknown key", printable(rid))
            return await errors.send(send_with_id, errors.Unauthorized(
                message, code="missing_api_key" if presented is None else "invalid_api_key"))
        scope[KEY_SCOPE] = key  # for the audit line of a refused admin request, too
        if not key.allows(policy.scope):
            log.info("403 %s %s: key %s lacks scope %s (request %s)", scope["method"], printable(path or scope["path"]),
                     printable(key.key_id), policy.scope, printable(rid))
            return await errors.send(send_with_id, errors.Forbidden(
                f"key '{key.key_id}' lacks the '{policy.scope}' scope this route needs", code="insufficient_scope"))
        return await self.app(scope, receive, send_with_id)
