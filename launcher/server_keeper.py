"""Keeps tritonserver running: after an abnormal exit (a signal, an abort, a non-zero code) the dead
server's stubs, /dev/shm regions and ports are reaped and the same command (same arguments, same models) is
started again after a backoff (launcher/keeper.py); an exit with code 0 is not restarted. Used by `make
triton` (launcher/stack.py), the fault tests and the soak (a thread each, `start_watching`).

`SupervisedServer` adds a supervisor (supervisor/monitor.py) per server life."""
from __future__ import annotations

import glob
import time
from collections.abc import Callable
from pathlib import Path

from launcher.cpu_notice import EXPECTED_MESSAGES
from launcher.keeper import Keeper, Restart, RestartPolicy
from launcher.processes import RunRecord, claim_ports, describe, kill_members, wait_port_free
from launcher.triton_server import TritonServer
from supervisor.processes import SHM_GLOB, process_group, started_since


class ServerKeeper(Keeper):
    """Owns a TritonServer; `start` (the first start, kept like a restart), then `watch` (blocking) or
    `start_watching` (a thread) restarts it.

    `on_down(cause)` runs when a death is seen, before the reaping (e.g. stop the supervisor, whose scans
    would otherwise race the reaping); `on_up()` after the new server answers ready.

    The reaping leaves nothing of the dead server for the next one to trip on: its process group (stubs that
    outlived it, e.g. the ones that were mid-call at an abort) killed and waited for until gone, its /dev/shm
    regions removed, and its ports free; its line says what it found. A start claims its ports first
    (launcher/processes.py `claim_ports`): a holder is named, and stopped only when a previous run of the same
    run folder left it behind (`record`: `<log>.pid`, beside the server's log)."""

    name, prefix = "tritonserver", "triton"
    restart_clean_exit = False
    note_every_s = 2.0
    # a CPU machine's start-up lines (launcher/cpu_notice.py), and the pinned-memory fallback on each call
    harmless_lines = tuple(m.split(" <")[0] for m in EXPECTED_MESSAGES) + ("failed to allocate pinned system memory",)

    def __init__(self, server: TritonServer, policy: RestartPolicy | None = None,
                 on_down: Callable[[str], None] | None = None, on_up: Callable[[], None] | None = None,
                 start_timeout_s: float = 600.0, record: RunRecord | None = None):
        super().__init__(server, policy, start_timeout_s=start_timeout_s, on_down=on_down, on_up=on_up)
        log_file = getattr(server, "log_file", None)
        self.record = record or (RunRecord(Path(log_file).with_suffix(".pid")) if log_file else None)

    @property
    def server(self) -> TritonServer:
        return self.service

    def ports(self) -> list[tuple[str, int]]:
        server = self.server
        return [(server.host, server.http_port), (server.host, server.grpc_port),
                (server.metrics_host, server.metrics_port)]

    def _claim(self) -> None:
        for host, port in self.ports():
            claim_ports(host, [port], self.record, self.name, say=self.say)

    def _launched_now(self) -> None:
        if self.record is not None and self.server.process is not None:
            self.record.write(self.server.process.pid)

    def launch_first(self) -> None:
        self._claim()
        self.server.launch()
        self._launched_now()

    def launch(self) -> None:
        # returns at once: step() sees it ready, dead (Triton 2.51 was seen to abort with a boost lock_exception
        # at start on a busy box: then it is one more crash) or late; a restart adds to the log
        self._claim()
        self.server.launch(append_log=True)
        self._launched_now()

    def is_up(self) -> bool:
        return self.server.is_up()

    def note(self) -> None:
        self.server.note_regions()  # for the reaping: a dead server's processes can no longer be asked

    def reap(self) -> None:
        dead = self.started[-1] if self.started and self.server.process is not None \
            and self.server.process.pid == self.started[-1][0] else None
        members = started_since(process_group(dead[0]), dead[1]) if dead else []
        regions = set(glob.glob(SHM_GLOB))
        began = time.monotonic()
        self.server.stop(timeout=self.reap_timeout_s)  # SIGKILL to its group, its regions unlinked
        stuck = kill_members(*dead, timeout=self.reap_timeout_s) if dead else []
        taken = [port for host, port in self.ports() if not wait_port_free(host, port, self.reap_timeout_s)]
        removed = len(regions - set(glob.glob(SHM_GLOB)))
        if dead is None:
            return
        would_not_die = f" ({', '.join(map(describe, stuck))} would not die)" if stuck else ""
        ports = f"{', '.join(map(str, taken))} still taken" if taken else "free"
        self.say(f"{self.prefix}: reaped the dead {self.name} (pid {dead[0]}) in {time.monotonic() - began:.1f}s: "
                 f"{len(members)} of its processes still alive{would_not_die}, {removed} /dev/shm regions removed, "
                 f"ports {ports}")


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
