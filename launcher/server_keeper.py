"""Keeps tritonserver running: after an abnormal exit (a signal, an abort, a non-zero code) the dead
server's stubs and /dev/shm regions are reaped and the same command (same arguments, same models) is
started again after a backoff (launcher/keeper.py); an exit with code 0 is not restarted. Used by `make
triton` (launcher/stack.py), the fault tests and the soak (a thread each, `start_watching`).

`SupervisedServer` adds a supervisor (supervisor/monitor.py) per server life."""
from __future__ import annotations

from collections.abc import Callable

from launcher.keeper import Keeper, Restart, RestartPolicy
from launcher.triton_server import TritonServer


class ServerKeeper(Keeper):
    """Owns a started TritonServer; `watch` (blocking) or `start_watching` (a thread) restarts it.

    `on_down(cause)` runs when a death is seen, before the reaping (e.g. stop the supervisor, whose scans
    would otherwise race the reaping); `on_up()` after the new server answers ready."""

    name, prefix = "tritonserver", "triton"
    restart_clean_exit = False
    note_every_s = 2.0

    def __init__(self, server: TritonServer, policy: RestartPolicy | None = None,
                 on_down: Callable[[str], None] | None = None, on_up: Callable[[], None] | None = None,
                 start_timeout_s: float = 600.0):
        super().__init__(server, policy, start_timeout_s=start_timeout_s, on_down=on_down, on_up=on_up)

    @property
    def server(self) -> TritonServer:
        return self.service

    def launch(self) -> None:
        # returns once the server is ready, its models loaded (Triton 2.51 was seen to abort with a boost
        # lock_exception at start on a busy box: then it is one more crash); a restart adds to the log
        self.server.start(timeout=self.start_timeout_s, append_log=True)

    def is_up(self) -> bool:
        return True  # launch returned: ready

    def note(self) -> None:
        self.server.note_regions()  # for the reaping: a dead server's processes can no longer be asked


class SupervisedServer:
    """A TritonServer kept running by a ServerKeeper thread, with a supervisor (supervisor/monitor.py) per
    server life: a new server gets a new supervisor (its stub tracker and unhealthy set start afresh), and
    `events` runs on across restarts. For the fault tests and the soak; `make triton` wires the same
    pieces itself (launcher/stack.py)."""

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
