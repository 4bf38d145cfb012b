"""One process-wide budget of request-body bytes held in memory (issue 25), BODY_BUFFER_BYTES, and each
key's share of it (issue 43), BODY_BUFFER_KEY_BYTES.

A route's cap bounds one body; this bounds all of them together: without it, N callers each sending a
body just under (or, chunked, up to) the cap pin N x the cap, and N is bounded only by MAX_CONNECTIONS.
A body takes its bytes from the budget as they arrive, never as declared: a `Content-Length` that nobody
sends holds nothing (it is only checked against what is free when the request starts, so that a body
that cannot fit is refused before it is read). The bytes go back when the request ends, since the app
holds the body until then. One owner (an API key; without keys, a client address) holds at most its
share, so that no one caller can hold the budget that every other caller needs. A body that does not fit
now gets a 503 with Retry-After (gateway/middleware/body_limits.py); a body larger than the share could
never fit, so the share is also a ceiling on every route's cap (413)."""
from __future__ import annotations

from gateway.middleware.policy import ROUTES, cap

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


def share_bytes(settings) -> int:
    """BODY_BUFFER_KEY_BYTES, checked; unset: the budget less one maximal /v1/embeddings body (at most half
    of it), so that whatever one key holds, another key's largest embeddings request still fits. At the
    defaults that is 29,294,592 bytes: one maximal image in base64 (/infer, a search by image) still fits."""
    total = budget_bytes(settings)
    value = settings.body_buffer_key_bytes
    if value is None:
        return total - min(cap(ROUTES[("POST", "/v1/embeddings")], settings), total // 2)
    if not 0 < value <= total:
        raise ValueError(f"BODY_BUFFER_KEY_BYTES must be between 1 and BODY_BUFFER_BYTES ({total}), not {value}")
    return value


class BodyBudget:
    """Bytes taken and given back by the requests of one event loop (no lock: no await in between), in all
    (`used`, at most `total`) and per owner (`held`, at most `share` each; an owner that holds nothing has
    no entry)."""

    def __init__(self, total: int, share: int | None = None):
        self.total, self.used = total, 0
        self.share = min(share or total, total)
        self.held: dict = {}

    def fits(self, size: int, owner=None) -> bool:
        return self.used + size <= self.total and self.held.get(owner, 0) + size <= self.share

    def take(self, size: int, owner=None) -> bool:
        mine = self.held.get(owner, 0) + size
        if self.used + size > self.total or mine > self.share:
            return False
        self.used += size
        self.held[owner] = mine
        return True

    def give(self, size: int, owner=None) -> None:
        self.used -= size
        mine = self.held.get(owner, 0) - size
        if mine > 0:
            self.held[owner] = mine
        else:
            self.held.pop(owner, None)
