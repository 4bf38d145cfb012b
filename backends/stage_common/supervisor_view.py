"""What a stage can read of the supervisor's published state (supervisor/state.py): whether it is healing a
model right now. `make triton` names the file in SUPERVISOR_STATE_FILE before it starts Triton, so every stub
inherits it (the gateway's /health reads the same file).

Why a BLS front asks (issue 48): between a callee's death and its heal, Triton 2.51 queues each request sent to
it to the dead stub and never answers it, and each such call holds a thread of the caller's Triton-side pool
for good. The supervisor sees the death within a scan (0.25 s) and lists the model until it is healed; a front
that reads the list refuses new calls at once (UNAVAILABLE) instead of sending them to the dead stub, and fails
the calls it was waiting on. A listing older than `stale_s` is ignored (a supervisor that stopped publishing
must not keep a model refused). Triton-free."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

STATE_VARIABLE = "SUPERVISOR_STATE_FILE"


class SupervisorView:
    def __init__(self, path: str | os.PathLike | None = None, stale_s: float = 120.0):
        self.path = Path(path) if path else None
        self.stale_s = stale_s
        self._lock = threading.Lock()
        self._seen: tuple[int, int] | None = None  # (inode, mtime_ns) of the file last parsed
        self._unhealthy: dict[str, str] = {}
        self._updated = 0.0

    @classmethod
    def from_env(cls) -> "SupervisorView":
        return cls(os.environ.get(STATE_VARIABLE) or None)

    def healing(self, model: str) -> bool:
        """Whether the supervisor lists `model` as down (dead or hung, being healed) in a fresh publication."""
        if self.path is None:
            return False
        try:
            stat = self.path.stat()
        except OSError:
            return False
        with self._lock:
            if self._seen != (stat.st_ino, stat.st_mtime_ns):  # written anew (atomically: a new inode)
                try:
                    state = json.loads(self.path.read_text())
                    self._unhealthy = dict(state.get("unhealthy", {}))
                    self._updated = float(state.get("updated", 0.0))
                except (OSError, ValueError, TypeError, AttributeError):
                    return False
                self._seen = (stat.st_ino, stat.st_mtime_ns)
            return model in self._unhealthy and time.time() - self._updated < self.stale_s

    def wait_healed(self, model: str, timeout_s: float, poll_s: float = 0.1) -> bool:
        """Whether `model` is not (or no longer) being healed, waiting up to `timeout_s` for its heal: a
        request that waits costs a thread, one refused at once comes back (a client's retry loop, on the
        cores the heal needs)."""
        deadline = time.monotonic() + timeout_s
        while self.healing(model):
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True
