"""What the keepers and the stop paths do to processes: a stop that cannot leave children behind, a kill of a
whole tree or group, free ports, and a port's claim (its holder named, or stopped when a previous run of the same
data folder left it behind: `RunRecord`). What they ask about processes is `supervisor.processes`."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from supervisor.processes import (Identity, command_line, group_of, identity, listeners, process_group, process_tree,
                                  start_time, started_since, still_alive, still_runs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: TIME_WAIT is no obstacle
        try:
            s.bind((host or "0.0.0.0", port))
            return True
        except OSError:
            return False


def terminate(process: subprocess.Popen, timeout: float, group: bool = False) -> None:
    """SIGTERM, up to `timeout` to exit, then SIGKILL: the process, or with `group` its whole process group
    (always: children it leaves behind, such as a server's stubs, must not outlive it)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    if group:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    elif process.poll() is None:
        process.kill()
    process.wait()


def kill_tree(pid: int) -> None:
    for member in reversed(process_tree(pid)):
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            pass


def signal_group(pgid: int, signum: int = signal.SIGKILL) -> None:
    """A signal to a whole process group; nothing if the group is gone or not ours."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def kill_members(pgid: int, since: float, timeout: float = 10.0) -> list[int]:
    """SIGKILL to every process of group `pgid` started at or after `since` (start_time's clock: a group given
    the same number later is not touched), then waits up to `timeout` for them to exit; returns those that did
    not (a process stuck in the kernel: its sockets and mappings stay until it goes)."""
    members = started_since(process_group(pgid), since)
    for pid in members:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return still_alive(members, timeout)


def describe(pid: int) -> str:
    """'pid 123 (python -m gateway)' for a person reading a refusal: the program and its first two arguments
    only, since a later one may carry a secret (an old Triton's admin key)."""
    argv = list(command_line(pid) or ())
    command = " ".join([os.path.basename(argv[0])] + argv[1:3]) if argv else "?"
    return f"pid {pid} ({command[:120]})"


class PortTaken(RuntimeError):
    pass


class RunRecord:
    """`DATA_DIR/run/<name>.pid`: which process a launcher of this data folder started last, and which launcher
    started it (both identities, JSON). The next start on the same ports reads it: a process still holding a port
    while the launcher that started it is gone was left behind (the launcher was killed, or crashed) and is
    stopped; a holder started by a launcher that still runs is a live run, and is refused, never stopped."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def write(self, pid: int) -> None:
        own, launcher = identity(pid), identity(os.getpid())
        if own is None or launcher is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # identities only: a command line can carry secrets (Triton's admin key), and the file is a plain one
        self.path.write_text(json.dumps({"pid": own, "launcher": launcher}))

    def read(self) -> tuple[Identity, Identity] | None:
        try:
            record = json.loads(self.path.read_text())
            return tuple(record["pid"]), tuple(record["launcher"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def left_behind(self, pid: int) -> Identity | None:
        """The recorded process (its group's leader) when `pid` is of its process group, started after it, and the
        launcher that started it no longer runs; else None."""
        record = self.read()
        if record is None:
            return None
        (leader, started), launcher = record
        if group_of(pid) != leader or (start_time(pid) or -1.0) < started or still_runs(launcher):
            return None
        return leader, started


def claim_ports(host: str, ports: list[int], record: RunRecord | None, name: str, timeout: float = 15.0,
                say=print) -> None:
    """Before `name` binds `ports`: a port held by what a previous run of the same data folder left behind
    (`record`) is freed (its process group stopped); any other holder is named in PortTaken."""
    for port in ports:
        if port_free(host, port):
            continue
        holders = listeners(port)
        left = {record.left_behind(pid) for pid in holders} if record and holders else {None}
        if None in left:
            who = ", ".join(describe(pid) for pid in holders) or "a process this user cannot see"
            recorded = f" ({record.path})" if record else ""
            raise PortTaken(f"{name}: port {port} is taken by {who}; it is not one a previous run of this data "
                            f"folder left behind{recorded}: stop it or choose another port")
        for leader, started in left:
            say(f"{name}: port {port} is held by {', '.join(describe(pid) for pid in holders)}, left behind by a "
                f"previous run of this data folder ({record.path}): stopping it")
            signal_group(leader, signal.SIGTERM)
            if still_alive(started_since(process_group(leader), started), 5.0):
                kill_members(leader, started)
        if not wait_port_free(host, port, timeout):
            raise PortTaken(f"{name}: port {port} is still taken after its holder was stopped")


def wait_port_free(host: str, port: int, timeout: float, poll_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while not port_free(host, port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def lower_session_priority(leader: int, nice: int) -> bool:
    """Gives the session `leader` leads (a server started in a session of its own, and every stub it forks later)
    `nice` more than the default. The processes' own nice value (`nice -n` in their command) is not enough on
    Linux with autogroup on (the default on desktops and on this box): the scheduler first shares the CPU
    between sessions equally, whatever their threads' nice values, so the session's autogroup gets the value
    too (/proc/<pid>/autogroup; a user may lower their own session's priority). False where the kernel has no
    autogroup (the thread nice values then do the work)."""
    try:
        Path(f"/proc/{leader}/autogroup").write_text(str(nice))
        return True
    except OSError:
        return False
