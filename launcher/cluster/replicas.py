"""A replica: one `python -m launcher` (Triton, supervisor, gateway) on its own ports and DATA_DIR, and the
keeper that starts it again when it exits while the cluster is not stopping: at once after a clean exit
(cluster-rolling's SIGTERM), after the backoff after a crash, once whatever the dead launcher left running
is killed; a crash loop leaves that replica down and says so."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from launcher.keeper import Keeper, RestartPolicy
from supervisor.processes import TreeRegions, command_line, process_tree, start_time, still_runs


def server_name(index: int) -> str:
    return f"replica-{index}"


@dataclass
class Replica:
    index: int
    gateway_port: int
    http_port: int
    grpc_port: int
    metrics_port: int
    data_dir: Path
    process: subprocess.Popen | None = None
    policy: RestartPolicy = field(default_factory=lambda: RestartPolicy(max_restarts=5, window_s=300))
    exits: list[tuple[float, str]] = field(default_factory=list)  # (unix time, cause)
    given_up: str | None = None
    # the launcher's processes as last seen (pid -> start time): a launcher killed with SIGKILL leaves its
    # tritonserver and gateway running in sessions of their own, holding the replica's ports
    seen: dict[int, float | None] = field(default_factory=dict)
    mapped: TreeRegions = field(default_factory=TreeRegions)  # /dev/shm regions its servers mapped

    @property
    def name(self) -> str:
        return server_name(self.index)

    @property
    def log_file(self) -> Path:
        return self.data_dir / "launcher.log"

    def note(self) -> None:
        """Its launcher's processes and /dev/shm regions: what a reaping removes if they are left."""
        if self.process is not None and self.process.poll() is None:
            tree = process_tree(self.process.pid)
            self.seen.update({pid: start_time(pid) for pid in tree if pid not in self.seen})
            self.mapped.note(tree)


def replica_processes(launcher_pid: int) -> dict[str, list[int]]:
    """A replica's gateway and tritonserver pids, found in its launcher's process tree."""
    found: dict[str, list[int]] = {"gateway": [], "tritonserver": []}
    for pid in process_tree(launcher_pid):
        argv = command_line(pid) or ()
        if argv[:1] and argv[0].endswith("/tritonserver"):
            found["tritonserver"].append(pid)
        elif argv[1:3] == ("-m", "gateway"):
            found["gateway"].append(pid)
    return found


def reap(replica: Replica) -> int:
    """Kills the processes of the replica's last launcher still running (the same pid and start time) and
    removes the /dev/shm regions its servers mapped; returns how many processes it killed."""
    killed, seen = 0, [(pid, started) for pid, started in replica.seen.items() if started is not None]
    for process in seen:
        if still_runs(process):
            try:
                os.kill(process[0], signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 10
    while any(still_runs(process) for process in seen) and time.monotonic() < deadline:
        time.sleep(0.05)
    for region in replica.mapped.regions:
        Path(region).unlink(missing_ok=True)
    replica.seen.clear()
    replica.mapped.clear()
    return killed


class ReplicaKeeper(Keeper):
    """Keeps a replica's launcher running, stepped by the cluster's loop. `launch(replica)` is the cluster's
    (its command and environment); the replica's readiness is HAProxy's health check, not the keeper's."""

    prefix = "cluster"
    clean_exit_counts = False  # a clean exit is a rolling restart: back at once

    def __init__(self, replica: Replica, launch: Callable[[Replica], None], say: Callable[[str], None]):
        super().__init__(replica, replica.policy, say=say, name=f"{replica.name}'s launcher",
                         on_down=lambda cause: replica.exits.append((time.time(), cause)),
                         on_give_up=self._left_down)
        self._launch_replica = launch

    @property
    def replica(self) -> Replica:
        return self.service

    def launch(self) -> None:
        self._launch_replica(self.replica)

    def is_up(self) -> bool:
        return True

    def reap(self) -> None:
        left = reap(self.replica)
        if left:
            self.say(f"cluster: {self.replica.name}: killed {left} processes its launcher left running")

    def _left_down(self, failure: str) -> None:
        self.replica.given_up = f"{failure}: left down"
        self.say(f"cluster: {self.replica.given_up}")
