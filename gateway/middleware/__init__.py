"""Everything that runs around the routes of every request, installed by `install` in this order,
outermost first (a request meets them top to bottom, its response bottom to top):

1. replica_id.py   x-replica-id on every response, the 500s included (wraps the whole stack)
   tracing.py      x-request-id on every response, the 500s included; with tracing on, the request's
                   server span (and its quota stage around 6.); ACCESS_LOG=1: one line per request
   -- Starlette's ServerErrorMiddleware: an exception nothing caught becomes a 500 (gateway/errors.py)
2. metrics.py      gateway_requests, gateway_errors, gateway_request_duration_seconds per route template
3. audit.py        one JSON line per admin request, refused ones (401, 403, 413, 429, 503) too
4. auth.py         401 / 403 from the key and the route's scope, before any body is read; x-request-id;
                   without keys, 403 for a Host or Origin that is not loopback (local_origin.py)
5. admission.py    503 while Triton cannot serve or the gateway drains, and on a route whose pipeline is still
                   being built (gateway/build_state.py); answers what the drain deadline cuts.
                   After auth and audit: an unknown key is 401 and an admin attempt audited, whatever the state
6. quotas.py       429 over a key's requests per second or requests in flight
7. body_limits.py  413 / 408 / 503: the route's body cap, BODY_TIMEOUT_S, BODY_BUFFER_BYTES and each key's
                   share of it, BODY_BUFFER_KEY_BYTES (body_budget.py)
   -- FastAPI: exception handlers (gateway/errors.py), then the route; JSON bodies are parsed strictly
      (strict_json.py), and POST /v1/completions counts its tokens per key (QuotaBook.charge_tokens)

policy.py is the table of every route's scope, body cap, error statuses and audit flag that auth, audit
and the body caps read (and the OpenAPI document, gateway/pages/openapi.py)."""
from __future__ import annotations

from fastapi import FastAPI

from gateway.build_state import BuildWatch
from gateway.keys import KeyRing
from gateway.middleware import replica_id, tracing
from gateway.middleware.admission import Admission, Admit
from gateway.middleware.audit import Audit, AuditLog
from gateway.middleware.auth import Authenticate
from gateway.middleware.body_budget import BodyBudget, budget_bytes, share_bytes
from gateway.middleware.body_limits import CapBodies
from gateway.middleware.local_origin import LocalOrigin
from gateway.middleware.metrics import GatewayMetrics, Measure, add_route
from gateway.middleware.policy import RouteTable
from gateway.middleware.quotas import QuotaBook, Quotas
from gateway.settings import Settings


def install(app: FastAPI, settings: Settings, ring: KeyRing | None) -> RouteTable:
    """Add the middleware above to `app`, in the order above, and keep on app.state what others reach:
    `admission` (the server watch, the drain on SIGTERM), `quotas` (closed at shutdown; the completions
    router's token count), `body_budget`, `metrics`. Returns the route table (checked complete at start)."""
    routes = RouteTable(app)
    state = app.state
    state.routes = routes  # also the Allow header of a 405 (gateway/errors.py)
    state.admission = Admission(drain_s=settings.drain_s, builds=BuildWatch(settings.build_state_dir))
    state.metrics = GatewayMetrics()
    state.quotas = QuotaBook(settings, state.metrics.registry)  # its store's breaker: gateway_quota_store_up
    # request-body bytes held, all requests together and per key (client address without keys)
    state.body_budget = BodyBudget(budget_bytes(settings), share_bytes(settings))
    outermost_first = [
        (Measure, {"metrics": state.metrics}),
        (Audit, {"routes": routes, "audit_log": AuditLog(settings.data_dir / "audit.log")}),
        (Authenticate, {"routes": routes, "ring": ring,
                        "local_origin": LocalOrigin(settings.allowed_hosts, settings.port) if ring is None else None}),
        (Admit, {"admission": state.admission}),
        (Quotas, {"book": state.quotas}),
        (CapBodies, {"routes": routes, "settings": settings, "budget": state.body_budget}),
    ]
    tracing.install(app, outermost_first)  # around the 500 handler; traced: the quota stage around Quotas
    for middleware, options in reversed(outermost_first):  # add_middleware puts the last added outermost
        app.add_middleware(middleware, **options)
    add_route(app, state.metrics)  # GET /metrics/prometheus
    replica_id.install(app)  # outside everything add_middleware builds, ServerErrorMiddleware included
    return routes
