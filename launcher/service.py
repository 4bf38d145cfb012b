"""What every server this package runs has in common (tritonserver, the gateway, Redis, HAProxy): it is
launched as a child in a session of its own, it answers once it is up, and it is stopped. `start` is launch
plus the wait until it answers; `with` starts and stops it. A keeper (keeper.py) drives the same three
parts when it starts one again."""
from __future__ import annotations

import subprocess
import threading
import time
import urllib.request
from pathlib import Path


def spawn(command: list[str], log_file: Path | None = None, append: bool = True, **popen) -> subprocess.Popen:
    """A child in a session of its own (a signal to its group reaches whatever it starts), its output to
    `log_file` (inherited without one)."""
    out = open(log_file, "ab" if append else "wb") if log_file else None
    try:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **popen)
    finally:
        if out is not None:
            out.close()  # the child holds its own copy


def answers(url: str, timeout: float = 2.0) -> bool:
    """Whether `url` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


class StartStop:
    """`with` starts it and stops it, whatever happens inside."""

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class Service(StartStop):
    name = "process"  # in its messages: "<name> exited with code 1"
    not_up = "not up"  # "<name> not up after 30s"
    poll_s = 0.2
    start_timeout_s = 300.0
    process: subprocess.Popen | None = None
    log_file: Path | None = None

    def launch(self, **options) -> None:
        """Starts the process without waiting for it to answer."""
        raise NotImplementedError

    def is_up(self) -> bool:
        raise NotImplementedError

    def stop(self, timeout: float | None = None) -> None:
        """Ends the process and whatever it started; a no-op once stopped."""
        raise NotImplementedError

    def start(self, timeout: float | None = None, **options) -> "Service":
        timeout = timeout or self.start_timeout_s
        self.launch(**options)
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float, stop: threading.Event | None = None) -> bool:
        """Until it answers (True) or `stop` is set (False); raises when it exits or is not up in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.process.returncode}{self.log_hint()}")
            if self.is_up():
                return True
            if stop is None:
                time.sleep(self.poll_s)
            elif stop.wait(self.poll_s):
                return False
        raise TimeoutError(f"{self.name} {self.not_up} after {timeout:.0f}s{self.log_hint()}")

    def log_hint(self) -> str:
        return f" (log: {self.log_file})" if self.log_file else ""
