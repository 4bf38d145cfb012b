"""An exclusive lock file (flock) held across threads and processes, waited for with a deadline: the ONNX
export cache (gateway/modelgen/onnx_cache.py) and hub downloads (gateway/hub/download.py) use it so that
concurrent registrations of the same weights, in one gateway or several, do the work once."""
from __future__ import annotations

import fcntl
import time
from pathlib import Path


class FileLock:
    """flock on `path`, waited for at most `timeout_s` (TimeoutError after it: the holder's work is bounded)."""

    def __init__(self, path: Path, timeout_s: float):
        self.path, self.timeout_s = path, timeout_s

    def __enter__(self):
        self.file = open(self.path, "a")
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self.file.close()
                    raise TimeoutError(f"{self.path} held for more than {self.timeout_s:.0f}s") from None
                time.sleep(0.2)

    def __exit__(self, *exc):
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()
