"""The project's one vocabulary for questions about processes, answered by psutil: is it alive, which process is
it, what command runs it, how much CPU it used, what it started, which /dev/shm regions it maps. Only questions:
what acts on processes (a stop, a kill) is the launcher's (`launcher.processes`).

A pid alone does not name a process: pids wrap (pid_max is 32768 here) and a dead process's pid is given to a new
one. A pid and its start time do: that pair is a process's identity here. "Gone" is said one way: None (or False,
or an empty result), never a sentinel number."""
from __future__ import annotations

import fnmatch
import os
import time

import psutil

# the Python backend's regions: python: triton_python_backend_..., Python-based: triton_<backend>_backend_...
SHM_GLOB = "/dev/shm/triton_*shm_region_*"

Identity = tuple[int, float]  # (pid, start time): one process, whatever its pid's later fate


def start_time(pid: int) -> float | None:
    """When the process started, in seconds after boot (to the clock tick); None if it is gone. psutil's
    create_time() is that plus the boot time, which moves when the system clock is stepped: taken off again, the
    value never changes for the life of the process, as an identity must not. A pid reused later starts later."""
    try:
        return round(psutil.Process(pid).create_time() - psutil.boot_time(), 6)
    except psutil.NoSuchProcess:
        return None


def identity(pid: int) -> Identity | None:
    started = start_time(pid)
    return None if started is None else (pid, started)


def alive(pid: int | None) -> bool:
    """The process runs: a zombie (exited, not yet reaped by its parent) does not."""
    if not pid:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's: it exists
        return True


def still_runs(process: Identity) -> bool:
    """The process of this identity is alive: not gone, and its pid not given to another since."""
    pid, started = process
    return start_time(pid) == started and alive(pid)


def cpu_time(pid: int) -> float | None:
    """User + system CPU seconds the process has used; None if it is gone."""
    try:
        used = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return used.user + used.system


def command_line(pid: int) -> tuple[str, ...] | None:
    """The process's argv (empty for a zombie); None if it is gone."""
    try:
        return tuple(psutil.Process(pid).cmdline())
    except psutil.Error:
        return None


def live_children(pid: int) -> dict[int, tuple[str, ...]]:
    """The direct children of the process that are alive (zombies left out): pid -> argv."""
    try:
        children = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return {}
    found = {}
    for child in children:
        try:
            with child.oneshot():
                if child.status() != psutil.STATUS_ZOMBIE:
                    found[child.pid] = tuple(child.cmdline())
        except psutil.Error:  # exited since
            continue
    return found


def process_tree(pid: int) -> list[int]:
    """The process and all its descendants, the process first; empty if it is gone."""
    try:
        return [pid] + [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def process_group(pgid: int) -> list[int]:
    """Every process of a process group: a dead server's stubs, re-parented, are still in the server's."""
    members = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid:  # psutil has no process group: the system call answers
                members.append(pid)
        except ProcessLookupError:
            continue
    return members


def shm_regions_mapped(pids: list[int]) -> set[str]:
    """The Python-backend shared-memory regions (SHM_GLOB) these processes map; a region already unlinked is
    skipped (psutil gives its path without the kernel's " (deleted)")."""
    regions = set()
    for pid in pids:
        try:
            maps = psutil.Process(pid).memory_maps(grouped=False)
        except psutil.Error:
            continue
        regions |= {m.path for m in maps if fnmatch.fnmatchcase(m.path, SHM_GLOB)}
    return {region for region in regions if os.path.exists(region)}


class TreeRegions:
    """The regions a process tree has mapped, re-read only when the tree's processes change. psutil reads maps
    from smaps (about 20 ms a process here, against 4 ms for a bare maps read), and a keeper notes every few
    seconds; a tree's regions only change when a process comes or goes (Triton creates each stub's region, and
    maps it, before it starts that stub), so an unchanged set of identities has nothing new to tell."""

    def __init__(self) -> None:
        self.regions: set[str] = set()
        self._identities: frozenset[Identity] = frozenset()

    def note(self, pids: list[int]) -> set[str]:
        identities = frozenset(filter(None, map(identity, pids)))
        if identities != self._identities:
            self._identities = identities
            self.regions |= shm_regions_mapped(pids)
        return self.regions

    def clear(self) -> None:
        self.regions.clear()
        self._identities = frozenset()


def listeners(port: int) -> list[int]:
    """The processes listening on TCP `port` (any address): who holds it. A socket whose owner this user may not
    see has no pid here, so a taken port can have no holder named."""
    found = set()
    for connection in psutil.net_connections(kind="tcp"):
        if connection.status == psutil.CONN_LISTEN and connection.laddr and connection.laddr.port == port \
                and connection.pid:
            found.add(connection.pid)
    return sorted(found)


def group_of(pid: int) -> int | None:
    """The process's process group; None if it is gone."""
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def started_since(pids: list[int], since: float) -> list[int]:
    """Those of `pids` that started at or after `since` (start_time's clock): a group's members, not a later
    group that was given the same number."""
    return [pid for pid in pids if (start_time(pid) or -1.0) >= since]


def still_alive(pids: list[int], timeout: float = 0.0, poll_s: float = 0.05) -> list[int]:
    """Those of `pids` still alive after waiting up to `timeout` for them to exit (a zombie counts as gone). Only
    looks: it reaps nothing, so a caller's own child keeps its exit status for its Popen."""
    deadline = time.monotonic() + timeout
    while True:
        running = [pid for pid in pids if alive(pid)]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(poll_s)
