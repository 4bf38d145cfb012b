"""One process-wide budget of request-body bytes held in memory (issue 25), BODY_BUFFER_BYTES.

A route's cap bounds one body; this bounds all of them together: without it, N callers each sending a
body just under (or, chunked, up to) the cap pin N x the cap, and N is bounded only by MAX_CONNECTIONS.
A body takes its bytes from the budget as they arrive (a `Content-Length` body takes its declared size
before anything is read) and gives them back when its request ends, since the app holds the body until
then. A body that does not fit now gets a 503 with Retry-After (gateway/middleware/body_limits.py); a body larger
than the whole budget could never fit, so the budget is also a ceiling on every route's cap (413)."""
from __future__ import annotations

MIB = 1024 * 1024
# a maximal /v1/embeddings body (256 x 64 KiB) beside one maximal image in base64 (20 MiB x 4/3), and
# no more: 8 chunked 400 MB bodies at 64 MiB pinned +70 MiB of RSS, over issue 25's 50 MB goal
DEFAULT_BUDGET = 44 * MIB


def budget_bytes(settings) -> int:
    """BODY_BUFFER_BYTES (gateway/settings.py), checked."""
    value = settings.body_buffer_bytes
    if value <= 0:
        raise ValueError(f"BODY_BUFFER_BYTES must be positive, not {value}")
    return value


class BodyBudget:
    """Bytes taken and given back by the requests of one event loop (no lock: no await in between)."""

    def __init__(self, total: int):
        self.total, self.used = total, 0

    def take(self, size: int) -> bool:
        if self.used + size > self.total:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used -= size
