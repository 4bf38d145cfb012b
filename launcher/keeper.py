"""One keeper for every process that `make triton` and `make cluster` keep running: tritonserver, the
gateway, each replica's launcher, Redis and HAProxy.

A keeper watches its process. When it exits while no stop was asked, the keeper reaps what it left (the
service's stop: its process group, the /dev/shm regions its stubs mapped), waits a back-off and starts it
again, until it answers. Triton 2.51 cannot be fixed here (a killed decoupled stub holding its message-queue
mutex aborts the whole server), so the process above it heals what it cannot. A crash loop (`max_restarts`
restarts within `window_s`) gives up: `failure` says why, naming the last exit cause, `on_give_up` runs and
`watch` raises CrashLoop with the last lines of the log.

A stop means stop: once `request_stop()` has returned, the keeper starts nothing more, whatever the order in
which a death and the stop arrive. The stop's check and the spawn are one step under `_spawning` (a stop
requested meanwhile waits the few milliseconds of a spawn), and a spawn interrupted by a stop on its own thread
(a signal handler) is stopped at once. Every process a keeper started is remembered by its identity:
`kill_all()` (safe from a signal handler) and, at the interpreter's exit, `kill_everything_started()` kill
whichever of them, or of their process groups, still run, so that no keeper's child outlives the launcher.

Its lines state each outage from the death to serving again, with the restarts it took ("down from 12:00:01.2
to 12:00:28.1, 26.9s, 2 restarts tried"), and a start that dies names the last error line of its log.

`step()` is one look and never waits for a start; `watch()` repeats it until a stop (`make triton`'s main
thread; `start_watching` runs it in a thread); the cluster steps all its keepers from one loop. The service is
a Service (service.py); a subclass adapts another surface (server_keeper.py)."""
from __future__ import annotations

import atexit
import logging
import os
import re
import signal
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from launcher.processes import PortTaken, kill_members
from supervisor.processes import Identity, identity, still_runs

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
    down_since: float | None = None  # unix time of the death that began this outage (an earlier try's, if it failed)
    tries: int = 0  # starts tried in this outage, once up (1: the first restart served)

    def __post_init__(self):
        if self.down_since is None:
            self.down_since = self.died_at

    @property
    def ready_at(self) -> float | None:
        return self.up_at

    @property
    def outage_s(self) -> float | None:
        """From the death that began the outage to serving again: what the clients saw."""
        return None if self.up_at is None else self.up_at - self.down_since


def clock(unix: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(unix)) + f".{int(unix * 10) % 10}"


ERROR_LINE = re.compile(r"\berror\b|^E\d{4} |failed|already in use|^Signal \(\d+\) received", re.IGNORECASE)


def last_error_line(path: Path | None, lines: int = 40, harmless: tuple[str, ...] = ()) -> str:
    """The last line of the log's tail that reads as an error, but for the `harmless` ones: why a start died,
    in the keeper's own line."""
    found = [line.strip() for line in log_tail(path, lines).splitlines()
             if ERROR_LINE.search(line) and not any(expected in line for expected in harmless)]
    return found[-1][:300] if found else ""


_keepers: "weakref.WeakSet[Keeper]" = weakref.WeakSet()


def kill_everything_started() -> None:
    """Kills whatever any keeper of this process started and still runs (atexit: the last line of defence)."""
    for keeper in list(_keepers):
        keeper.kill_all()


atexit.register(kill_everything_started)


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
    keeper's lines (default: this module's logger). `_spawning` is held while a start is decided and spawned,
    and `request_stop` waits for it (module docstring); `_lock` while the process is reaped or stopped, so that
    a stop taking it (GatewayKeeper's, which signals the process) never races the reaping. When both are
    held, `_spawning` is taken first."""

    name = "process"  # in its lines and messages: "<name> is down (killed by SIGKILL)"
    prefix = "launcher"  # its lines start "<prefix>: "
    restart_clean_exit = True  # False: an exit with code 0 ends the watch (tritonserver exits 0 only when told)
    clean_exit_counts = True  # False: a clean exit is started again at once, outside the crash-loop count
    note_every_s: float | None = None  # how often `note` runs while the process runs
    harmless_lines: tuple[str, ...] = ()  # error-looking log lines that never explain a death
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
        self._spawning = threading.RLock()
        self.started: list[Identity] = []  # every process this keeper started: kill_all's list
        self._thread: threading.Thread | None = None
        self._due = self._launched = self._noted = 0.0
        self._down_since: float | None = None  # the death that began the current outage (unix time)
        self._tries = 0  # starts tried since then
        _keepers.add(self)

    # -- the service's part: a subclass adapts another surface
    @property
    def process(self):
        return self.service.process

    def launch(self) -> None:
        """Starts the process again (a restart), without waiting for it to answer."""
        self.service.launch()

    def launch_first(self) -> None:
        """The first start's launch (a subclass: a fresh log rather than an appended one)."""
        self.launch()

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
        if isinstance(exc, PortTaken):
            return f"not started: {exc}"
        code = getattr(self.service, "last_exit_code", None)
        if code is not None:
            return f"died while starting: {describe_exit(code)}{self._log_reason()}"
        return f"died while starting: {str(exc).split(' (log: ')[0]}{self._log_reason()}"

    def _log_reason(self) -> str:
        line = last_error_line(self.log_file(), harmless=self.harmless_lines)
        return f": {line}" if line else ""

    # -- stopping
    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        """No start from now on (safe from a signal handler): the next exit is the last. Returns once no spawn is
        under way on another thread (a spawn takes milliseconds; one on this thread, interrupted by a signal
        handler, is stopped by `_spawn` itself)."""
        self._stop.set()
        with self._spawning:
            pass

    def kill_all(self) -> None:
        """SIGKILL to every process this keeper started that still runs, and to its process group's members
        (a server's stubs): the launcher's second signal and its exit. Safe from a signal handler: no lock."""
        current = self.process
        known = list(self.started)
        if current is not None and current.pid not in {pid for pid, _ in known}:
            known.append(identity(current.pid) or (current.pid, 0.0))
        for pid, started in known:
            if still_runs((pid, started)):  # itself, group leader or not
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            kill_members(pid, started, timeout=0)  # its group: a server's stubs

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
                self._down(f"died while starting: {describe_exit(code)}{self._log_reason()}")
            elif now - self._launched > self.start_timeout_s:
                self._down("not ready in time while starting")
            else:
                return False
            return True
        if code is None:
            self._adopt()  # a process started outside the keeper (the launcher's first start of the gateway)
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
        """The first start, kept like a restart: a process that dies or hangs while starting is started again.
        Starts nothing once a stop was requested (then `process` stays None)."""
        try:
            if not self._spawn(self.launch_first):
                return
            self.service.wait_ready(timeout or self.start_timeout_s)
        except Exception as exc:
            with self._lock:
                self.service.stop()  # as Service.start does: nothing half-started is left
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
        died_at = time.time()
        if self._down_since is None:
            self._down_since, self._tries = died_at, 0
        self.restarts.append(Restart(died_at, cause, down_since=self._down_since))
        self.say(f"{self.prefix}: {self.name} is down ({cause}){self._log_hint()}")
        if self.on_down:
            self.on_down(cause)
        with self._lock:
            self.reap()
        now = time.monotonic()
        if self._stop.is_set():  # the stop came with the death: nothing is started again
            self.say(f"{self.prefix}: {self.name} not restarted: stopping")
            self.state = DOWN
            return
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

    def _spawn(self, launch: Callable[[], None]) -> bool:
        """The stop's check and the spawn, as one step (`_spawning`): False, and nothing started, once a stop was
        requested. A stop that a signal handler requested on this very thread while it spawned finds the process
        started: it is stopped here, at once."""
        with self._spawning:
            if self._stop.is_set():
                return False
            self._launched = time.monotonic()
            self._tries += 1
            try:
                launch()
            finally:
                self._adopt()
            if self._stop.is_set():
                with self._lock:
                    self.service.stop()
                return False
        return True

    def _adopt(self) -> None:
        """Remembers the current process by its identity (kill_all)."""
        process = self.process
        if process is not None and (not self.started or self.started[-1][0] != process.pid):
            found = identity(process.pid)
            if found is not None:
                self.started.append(found)

    def _launch(self) -> bool:
        try:
            if not self._spawn(self.launch):
                return False
        except Exception as exc:  # it died or hung while starting: counts as one more crash
            if not self._stop.is_set():
                self._down(self.starting_failure(exc))
            return True
        self.state = STARTING
        return True

    def _up(self) -> None:
        restart = self.restarts[-1]
        restart.start_s, restart.up_at, restart.tries = time.monotonic() - self._launched, time.time(), self._tries
        self._down_since = None
        self.state = RUNNING
        self.say(f"{self.prefix}: {self.name} serving again (pid {self.process.pid}): down from "
                 f"{clock(restart.down_since)} to {clock(restart.up_at)}, {restart.outage_s:.1f}s, "
                 f"{restart.tries} restart{'s' if restart.tries != 1 else ''} tried; this start took "
                 f"{restart.start_s:.1f}s")
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
        """Stop watching, then stop the process (reaping what it started), then kill anything it ever started
        that still runs."""
        self.request_stop()
        self.join(120)
        with self._lock:
            self.service.stop()
        self.kill_all()
