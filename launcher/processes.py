"""What the keepers and the stop paths read from /proc and do to processes: process trees and groups, the
Python-backend /dev/shm regions they map, a stop that cannot leave children behind, and free ports."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

SHM_GLOB = "/dev/shm/triton_*shm_region_*"  # python: triton_python_backend_..., Python-based: triton_<backend>_backend_...


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


def process_tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    return tree


def process_group(pgid: int) -> list[int]:
    """Every process of a process group: a dead server's stubs, re-parented, are still in the server's."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                members.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return members


def shm_regions_mapped(pids: list[int]) -> set[str]:
    """The Python-backend shared-memory regions these processes map (a region already unlinked is skipped)."""
    regions = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            path = line.split(maxsplit=5)[-1]
            if path.startswith("/dev/shm/triton_") and "_shm_region_" in path and not path.endswith("(deleted)"):
                regions.add(path)
    return regions


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) is not alive
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def start_time(pid: int) -> int:
    """The process's start time (clock ticks since boot): a pid and its start time name one process, even
    after the pid is reused."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return -1


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
