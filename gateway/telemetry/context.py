"""The request id of the request being served, for error bodies and log lines: set by
gateway/middleware/tracing.py for the whole of a request (its task and the tasks it starts copy it),
None outside any request. A context variable costs ~0.1 us to set: the id travels with or without tracing."""
from __future__ import annotations

from contextvars import ContextVar

REQUEST_ID: ContextVar[str | None] = ContextVar("gateway_request_id", default=None)


def request_id() -> str | None:
    return REQUEST_ID.get()
