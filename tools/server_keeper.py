"""Keeps tritonserver running: after an abnormal exit (a signal, an abort, a non-zero code) the dead
server's stubs and /dev/shm regions are reaped and the same command (same arguments, same models) is
started again after a backoff. Triton 2.51 cannot be fixed here (a killed decoupled stub holding its
message-queue mutex aborts the whole server), so the process above it heals what it cannot.

A crash loop (`max_restarts` restarts within `window_s`) gives up: `CrashLoop` raises, naming the last
exit cause and the server's log. Used by `make triton` (tools/triton_launcher.py), the fault tests and
the soak (a thread each, `start_watching`)."""
from __future__ import annotations

import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tools.triton_server import TritonServer

log = logging.getLogger("triton.keeper")


def describe_exit(code: int | None) -> str:
    """An exit status as a person reads it: 'killed by SIGKILL', 'aborted (SIGABRT)', 'exit code 1'."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return "aborted (SIGABRT)" if name == "SIGABRT" else f"killed by {name}"
    if code > 128 and code - 128 in signal.Signals._value2member_map_:  # a shell-style status
        return f"exit code {code} ({signal.Signals(code - 128).name})"
    return f"exit code {code}"


@dataclass
class RestartPolicy:
    """Backoff between tries (doubling from `backoff_s` up to `max_backoff_s`) and the crash-loop limit."""
    max_restarts: int = 5
    window_s: float = 120.0
    backoff_s: float = 1.0
    max_backoff_s: float = 15.0
    _restarts: deque = field(default_factory=deque)

    def next_delay(self, now: float) -> float | None:
        """Records a restart at `now`; its delay, or None when this one would be a crash loop."""
        while self._restarts and now - self._restarts[0] > self.window_s:
            self._restarts.popleft()
        if len(self._restarts) >= self.max_restarts:
            return None
        delay = min(self.max_backoff_s, self.backoff_s * 2 ** len(self._restarts))
        self._restarts.append(now)
        return delay


class CrashLoop(RuntimeError):
    pass


def starting_failure(exc: Exception, server) -> str:
    """Why a start failed, without the log's name (the keeper's messages name it once)."""
    code = getattr(server, "last_exit_code", None)
    if isinstance(exc, TimeoutError):
        return "not ready in time while starting"
    if code is not None:
        return f"died while starting: {describe_exit(code)}"
    return f"died while starting: {str(exc).split(' (log: ')[0]}"


def log_tail(path: Path | None, lines: int = 15) -> str:
    if path is None:
        return ""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class Restart:
    died_at: float  # unix time the exit was seen
    cause: str
    ready_at: float | None = None  # unix time the new server answered ready
    start_s: float | None = None  # process start to ready (model loads at start included)


class ServerKeeper:
    """Owns a started TritonServer; `watch` (blocking) or `start_watching` (a thread) restarts it.

    `on_down(cause)` runs when a death is seen, before the reaping (e.g. stop the supervisor, whose scans
    would otherwise race the reaping); `on_up()` after the new server answers ready."""

    def __init__(self, server: TritonServer, policy: RestartPolicy | None = None,
                 on_down: Callable[[str], None] | None = None, on_up: Callable[[], None] | None = None,
                 start_timeout_s: float = 600.0):
        self.server, self.policy = server, policy or RestartPolicy()
        self.on_down, self.on_up = on_down, on_up
        self.start_timeout_s = start_timeout_s
        self.restarts: list[Restart] = []
        self.failure: str | None = None  # the crash-loop message once given up
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        """No restart from now on (safe from a signal handler): the next exit is the last."""
        self._stop.set()

    def start(self, timeout: float | None = None) -> None:
        """The first start: a server that dies while starting (Triton 2.51 was seen to abort with a
        boost lock_exception at start on a busy box) is restarted like one that dies later."""
        try:
            self.server.start(timeout=timeout or self.start_timeout_s)
        except Exception as exc:
            if self._stop.is_set():
                raise
            self._restart(starting_failure(exc, self.server))

    def watch(self, note_every_s: float = 2.0) -> int:
        """Until a stop is requested: wait for the server's exit, restart it if that exit was abnormal.
        Returns the last exit code; raises CrashLoop when restarts keep failing."""
        while True:
            code = self._wait_exit(note_every_s)
            if code is None or self._stop.is_set():  # stopped on purpose (or a stop raced the exit)
                return code or 0
            if code == 0:
                log.warning("triton: tritonserver exited on its own with code 0: not restarted")
                return 0
            self._restart(describe_exit(code))

    def _wait_exit(self, note_every_s: float) -> int | None:
        last_note = 0.0
        while not self._stop.is_set():
            process = self.server.process
            if process is None:
                return None
            code = process.poll()
            if code is not None:
                return code
            if time.monotonic() - last_note >= note_every_s:
                self.server.note_regions()  # for the reaping: a dead server's processes can no longer be asked
                last_note = time.monotonic()
            self._stop.wait(0.1)
        return self.server.process.poll() if self.server.process else None

    def _restart(self, cause: str) -> None:
        while not self._stop.is_set():
            restart = Restart(time.time(), cause)
            self.restarts.append(restart)
            log.warning("triton: tritonserver is down (%s)%s", cause, self._log_hint())
            if self.on_down:
                self.on_down(cause)
            self.server.stop(timeout=10)  # reaps: the dead server's stubs (its process group) and regions
            delay = self.policy.next_delay(time.monotonic())
            if delay is None:
                self.failure = (f"tritonserver crash loop: {self.policy.max_restarts} restarts within "
                                f"{self.policy.window_s:.0f}s; last exit: {cause}{self._log_hint()}")
                tail = log_tail(self.server.log_file)
                raise CrashLoop(self.failure + (f"\n--- last lines of the log ---\n{tail}" if tail else ""))
            log.warning("triton: restarting tritonserver in %.1fs (same arguments and models)", delay)
            if self._stop.wait(delay):
                return
            started = time.monotonic()
            try:
                self.server.start(timeout=self.start_timeout_s, append_log=True)
            except Exception as exc:  # it died or hung while starting: counts as one more crash
                if self._stop.is_set():
                    return
                cause = starting_failure(exc, self.server)
                continue
            restart.start_s = time.monotonic() - started
            restart.ready_at = time.time()
            log.warning("triton: tritonserver restarted, ready in %.1fs (pid %d)", restart.start_s,
                        self.server.process.pid)
            if self.on_up:
                self.on_up()
            return

    def _log_hint(self) -> str:
        return f" (log: {self.server.log_file})" if self.server.log_file else ""

    # -- as a thread (fault tests, soak)
    def start_watching(self) -> "ServerKeeper":
        def run():
            try:
                self.watch()
            except CrashLoop as exc:
                log.error("%s", exc)

        self._thread = threading.Thread(target=run, name="server-keeper", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching, then stop the server (reaping its stubs and regions)."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join(120)
        self.server.stop()


class SupervisedServer:
    """A TritonServer kept running by a ServerKeeper thread, with a supervisor (supervisor/monitor.py) per
    server life: a new server gets a new supervisor (its stub tracker and unhealthy set start afresh), and
    `events` runs on across restarts. For the fault tests and the soak; `make triton` wires the same
    pieces itself (tools/triton_launcher.py)."""

    def __init__(self, server: TritonServer, make_supervisor: Callable[[TritonServer], object],
                 policy: RestartPolicy | None = None):
        self.server, self.make_supervisor = server, make_supervisor
        self.events: list[tuple[float, str, str]] = []  # the supervisors' (unix time, event, model)
        self.supervisor = None
        self.keeper = ServerKeeper(server, policy, on_down=self._down, on_up=self._up)

    @property
    def restarts(self) -> list[Restart]:
        return self.keeper.restarts

    def start(self, timeout: float = 600.0) -> "SupervisedServer":
        self.keeper.start(timeout)  # on_up has run if the first try had to be restarted
        if self.supervisor is None:
            self._up()
        self.keeper.start_watching()
        return self

    def _down(self, cause: str) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()
            self.supervisor = None

    def _up(self) -> None:
        if self.keeper.stopping:
            return
        supervisor = self.make_supervisor(self.server)
        supervisor.events = self.events  # before it starts: one history across server lives
        self.supervisor = supervisor.start()

    def stop(self) -> None:
        self.keeper.request_stop()
        if self.supervisor is not None:
            self.supervisor.request_stop()
        self.keeper.stop()
        if self.supervisor is not None:
            self.supervisor.stop()
            self.supervisor = None
