"""Finding Triton's Python stub processes in /proc and telling a dead stub from an unloaded model.

Stubs are children of tritonserver running `triton_python_backend_stub <model.py> <shm region> ... <instance>`
where the instance is `<model>_<group>_<index>`. A killed stub is gone or a zombie (empty cmdline), so
the tracker remembers each instance's pid and checks that pid, not the command line, on the next scan."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

STUB_BINARY = "triton_python_backend_stub"
_INSTANCE = re.compile(r"^(?P<model>.+)_\d+_\d+$")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str  # R, S, D, Z, ...
    argv: tuple[str, ...]


def read_proc(pid: int, proc: Path = Path("/proc")) -> Proc | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
        argv = (proc / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses
    return Proc(pid, int(fields[1]), fields[0], tuple(a for a in argv if a))


def instance_of(argv: tuple[str, ...]) -> str | None:
    """The model instance a stub serves (e.g. `text_embedding_encoder_0_0`), None if not a stub."""
    if not argv or not argv[0].endswith(STUB_BINARY):
        return None
    for arg in argv[2:]:
        if not arg.startswith("/") and "shm_region" not in arg and _INSTANCE.match(arg):
            return arg
    return None


def model_of(instance: str) -> str:
    match = _INSTANCE.match(instance)
    return match.group("model") if match else instance


def scan_stub_pids(server_pid: int, proc: Path = Path("/proc")) -> dict[int, str]:
    """Live (non-zombie) stubs of this server: pid -> instance. Two stubs can serve one instance name for a
    while: a reload's new stub and the old version's, until Triton (or the supervisor) retires the old one."""
    stubs: dict[int, str] = {}
    for entry in proc.glob("[0-9]*"):
        info = read_proc(int(entry.name), proc)
        if info is None or info.ppid != server_pid or info.state == "Z":
            continue
        instance = instance_of(info.argv)
        if instance:
            stubs[info.pid] = instance
    return stubs


def by_instance(stubs: dict[int, str], exclude=frozenset()) -> dict[str, int]:
    """instance -> pid of a scan, but the `exclude`d pids; of two stubs with one instance name, the higher pid
    (the newer, short of a pid wrap-around)."""
    return {instance: pid for pid, instance in sorted(stubs.items()) if pid not in exclude}


def of_model(stubs: dict[int, str], model: str) -> dict[int, str]:
    """The stubs of a scan that serve `model`'s instances."""
    return {pid: instance for pid, instance in stubs.items() if model_of(instance) == model}


def scan_stubs(server_pid: int, proc: Path = Path("/proc")) -> dict[str, int]:
    """Live stubs of this server: instance -> pid."""
    return by_instance(scan_stub_pids(server_pid, proc))


def cpu_ticks(pid: int, proc: Path = Path("/proc")) -> int | None:
    """User + system CPU time the process has used, in clock ticks (None if it is gone)."""
    try:
        fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)


@dataclass
class StubTracker:
    """Feeds on successive scans; reports models whose stub died while the model is still READY.

    A death is reported after it is seen on `confirm` consecutive scans, so that the short windows of a
    reload or an unload in progress are not mistaken for one; a model that is no longer READY (the
    gateway unloaded it) is forgotten, never healed."""
    confirm: int = 2
    known: dict[str, int] = field(default_factory=dict)  # instance -> pid last seen alive
    missing: dict[str, int] = field(default_factory=dict)  # instance -> consecutive scans seen dead

    def update(self, stubs: dict[str, int], ready_models: set[str]) -> dict[str, str]:
        """Returns {model: reason} for the deaths confirmed by this scan."""
        deaths: dict[str, str] = {}
        for instance, pid in list(self.known.items()):
            if model_of(instance) not in ready_models:
                self.known.pop(instance)
                self.missing.pop(instance, None)
            elif stubs.get(instance) is None:
                self.missing[instance] = self.missing.get(instance, 0) + 1
                if self.missing[instance] >= self.confirm:
                    deaths[model_of(instance)] = f"stub process {pid} of '{instance}' died"
            else:
                self.missing.pop(instance, None)
        for instance, pid in stubs.items():
            if model_of(instance) in ready_models:
                self.known[instance] = pid
                self.missing.pop(instance, None)
        return deaths

    def instances(self, model: str) -> list[str]:
        return [i for i in self.known if model_of(i) == model]

    def healed(self, model: str) -> None:
        """After a reload whose stubs run again: the instances stay known (a stub that dies right after
        its heal is a new death), their count of missed scans restarts."""
        for instance in self.instances(model):
            self.missing.pop(instance, None)
