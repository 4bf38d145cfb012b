"""One keeper for every process that `make triton` and `make cluster` keep running: tritonserver, the
gateway, each replica's launcher, Redis and HAProxy.

A keeper watches its process. When it exits while no stop was asked, the keeper reaps what it left (the
service's stop: its process group, the /dev/shm regions its stubs mapped), waits a back-off and starts it
again, until it answers. Triton 2.51 cannot be fixed here (a killed decoupled stub holding its message-queue
mutex aborts the whole server), so the process above it heals what it cannot. A crash loop (`max_restarts`
restarts within `window_s`) gives up: `failure` says why, naming the last exit cause, `on_give_up` runs and
`watch` raises CrashLoop with the last lines of the log.

`step()` is one look and blocks only while a service starts; `watch()` repeats it until a stop (`make
triton`'s main thread; `start_watching` runs it in a thread); the cluster steps all its keepers from one loop.
The service is a Service (service.py); a subclass adapts another surface (server_keeper.py)."""
from __future__ import annotations

import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("launcher.keeper")

RUNNING, DOWN, STARTING, ENDED, GIVEN_UP = "running", "down", "starting", "ended", "given up"


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

    @classmethod
    def at_once(cls) -> "RestartPolicy":
        """Started again at once, every time: the cluster's Redis and HAProxy, which nothing backs off from."""
        return cls(max_restarts=1 << 62, backoff_s=0.0, max_backoff_s=0.0)

    def next_delay(self, now: float) -> float | None:
        """Records a restart at `now`; its delay, or None when this one would be a crash loop."""
        while self._restarts and now - self._restarts[0] > self.window_s:
            self._restarts.popleft()
        if len(self._restarts) >= self.max_restarts:
            return None
        delay = min(self.max_backoff_s, self.backoff_s * 2 ** min(len(self._restarts), 32))
        self._restarts.append(now)
        return delay


class CrashLoop(RuntimeError):
    pass


@dataclass
class Restart:
    died_at: float  # unix time the exit was seen
    cause: str
    up_at: float | None = None  # unix time the new process answered
    start_s: float | None = None  # its launch to up (a server's model loads at start included)

    @property
    def ready_at(self) -> float | None:
        return self.up_at


def log_tail(path: Path | None, lines: int = 15) -> str:
    if path is None:
        return ""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class Keeper:
    """Keeps `service` (a started Service) running. `on_down(cause)` runs when a death is seen, before the
    reaping; `on_up()` once the new process answers; `on_give_up(message)` on a crash loop. `say` takes the
    keeper's lines (default: this module's logger). `_lock` is held while the process is reaped or launched,
    so that a stop taking it (GatewayKeeper's, which signals the process) never races a restart."""

    name = "process"  # in its lines and messages: "<name> is down (killed by SIGKILL)"
    prefix = "launcher"  # its lines start "<prefix>: "
    restart_clean_exit = True  # False: an exit with code 0 ends the watch (tritonserver exits 0 only when told)
    clean_exit_counts = True  # False: a clean exit is started again at once, outside the crash-loop count
    note_every_s: float | None = None  # how often `note` runs while the process runs
    reap_timeout_s = 10.0
    poll_s = 0.1

    def __init__(self, service, policy: RestartPolicy | None = None, *, start_timeout_s: float = 300.0,
                 on_down: Callable[[str], None] | None = None, on_up: Callable[[], None] | None = None,
                 on_give_up: Callable[[str], None] | None = None, say: Callable[[str], None] | None = None,
                 name: str | None = None, prefix: str | None = None):
        self.service, self.policy = service, policy or RestartPolicy()
        self.name, self.prefix = name or self.name, prefix or self.prefix
        self.start_timeout_s = start_timeout_s
        self.on_down, self.on_up, self.on_give_up, self._say = on_down, on_up, on_give_up, say
        self.restarts: list[Restart] = []
        self.failure: str | None = None  # the crash-loop message once given up
        self.state = RUNNING
        self.exit_code: int | None = None
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._due = self._launched = self._noted = 0.0

    # -- the service's part: a subclass adapts another surface
    @property
    def process(self):
        return self.service.process

    def launch(self) -> None:
        self.service.launch()

    def is_up(self) -> bool:
        return self.service.is_up()

    def reap(self) -> None:
        """Stops what the dead process left: its process group, its /dev/shm regions (the service's stop)."""
        self.service.stop(timeout=self.reap_timeout_s)

    def note(self) -> None:
        """While it runs, every `note_every_s`: what the reaping needs and cannot ask a dead process."""

    def log_file(self) -> Path | None:
        return getattr(self.service, "log_file", None)

    def say(self, line: str) -> None:
        if self._say is not None:
            self._say(line)
        else:
            log.warning("%s", line)

    def starting_failure(self, exc: Exception) -> str:
        """Why a start failed, without the log's name (the keeper's messages name it once)."""
        if isinstance(exc, TimeoutError):
            return "not ready in time while starting"
        code = getattr(self.service, "last_exit_code", None)
        if code is not None:
            return f"died while starting: {describe_exit(code)}"
        return f"died while starting: {str(exc).split(' (log: ')[0]}"

    # -- stopping
    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        """No restart from now on (safe from a signal handler): the next exit is the last."""
        self._stop.set()

    # -- the skeleton
    def step(self) -> bool:
        """One look: restarts what is due, notices an exit or a start that ended. True when something changed."""
        if self._stop.is_set() or self.state in (ENDED, GIVEN_UP):
            return False
        now = time.monotonic()
        if self.state == DOWN:
            return now >= self._due and self._launch()
        process = self.process
        if process is None:
            return False
        code = process.poll()
        if self.state == STARTING:  # up first: a process that answered and then exited had started
            if self.is_up():
                self._up()
            elif code is not None:
                self._down(f"died while starting: {describe_exit(code)}")
            elif now - self._launched > self.start_timeout_s:
                self._down("not ready in time while starting")
            else:
                return False
            return True
        if code is None:
            if self.note_every_s is not None and now - self._noted >= self.note_every_s:
                self.note()
                self._noted = now
            return False
        if self._stop.is_set():  # a stop raced the exit: the exit was asked for
            return False
        self.exit_code = code
        if code == 0 and not self.restart_clean_exit:
            self.say(f"{self.prefix}: {self.name} exited on its own with code 0: not restarted")
            self.state = ENDED
        else:
            self._down(describe_exit(code), counted=code != 0 or self.clean_exit_counts)
        return True

    def start(self, timeout: float | None = None) -> None:
        """The first start, kept like a restart: a process that dies or hangs while starting is started again."""
        try:
            self.service.start(timeout=timeout or self.start_timeout_s)
        except Exception as exc:
            if self._stop.is_set():
                raise
            self._down(self.starting_failure(exc))
            self._run(until_up=True)

    def watch(self) -> int:
        """Until a stop is requested: restart the process whenever it exits (not after a clean exit when
        `restart_clean_exit` is off). Returns the last exit code; raises CrashLoop when it gives up."""
        self._run()
        if self.state == ENDED:
            return self.exit_code or 0
        process = self.process
        return (process.poll() if process is not None else None) or 0

    def _run(self, until_up: bool = False) -> None:
        while not self._stop.is_set():
            self.step()
            if self.state == GIVEN_UP:
                tail = log_tail(self.log_file())
                raise CrashLoop(self.failure + (f"\n--- last lines of the log ---\n{tail}" if tail else ""))
            if self.state == ENDED or self.state == RUNNING and (until_up or self.process is None):
                return
            self._stop.wait(self.poll_s)

    def _down(self, cause: str, counted: bool = True) -> None:
        self.restarts.append(Restart(time.time(), cause))
        self.say(f"{self.prefix}: {self.name} is down ({cause}){self._log_hint()}")
        if self.on_down:
            self.on_down(cause)
        with self._lock:
            self.reap()
        now = time.monotonic()
        delay = self.policy.next_delay(now) if counted else 0.0
        if delay is None:
            self.failure = (f"{self.name} crash loop: {self.policy.max_restarts} restarts within "
                            f"{self.policy.window_s:.0f}s; last exit: {cause}{self._log_hint()}")
            self.state = GIVEN_UP
            if self.on_give_up:
                self.on_give_up(self.failure)
            return
        self.say(f"{self.prefix}: restarting {self.name} in {delay:.1f}s")
        self.state, self._due = DOWN, now + delay

    def _launch(self) -> bool:
        with self._lock:
            if self._stop.is_set():
                return False
            self._launched = time.monotonic()
            try:
                self.launch()
            except Exception as exc:  # it died or hung while starting: counts as one more crash
                if not self._stop.is_set():
                    self._down(self.starting_failure(exc))
                return True
            self.state = STARTING
        return True

    def _up(self) -> None:
        restart = self.restarts[-1]
        restart.start_s, restart.up_at = time.monotonic() - self._launched, time.time()
        self.state = RUNNING
        self.say(f"{self.prefix}: {self.name} restarted, up in {restart.start_s:.1f}s (pid {self.process.pid})")
        if self.on_up:
            self.on_up()

    def _log_hint(self) -> str:
        path = self.log_file()
        return f" (log: {path})" if path else ""

    # -- as a thread
    def start_watching(self) -> "Keeper":
        def run():
            try:
                self.watch()
            except CrashLoop as exc:
                log.error("%s", exc)

        self._thread = threading.Thread(target=run, name=f"{self.name}-keeper", daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float = 30.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def stop(self) -> None:
        """Stop watching, then stop the process (reaping what it started)."""
        self.request_stop()
        self.join(120)
        self.service.stop()
