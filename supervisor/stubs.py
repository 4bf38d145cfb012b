"""Finding Triton's Python stub processes and telling a dead stub from an unloaded model.

Stubs are children of tritonserver running `triton_python_backend_stub <model.py> <shm region> ... <instance>`
where the instance is `<model>_<group>_<index>`. A killed stub is gone or a zombie (empty cmdline), so
the tracker remembers each instance's stub by its identity (pid, start time: `supervisor.processes`), and
checks that process, not the name, on the next scan: two stubs can carry one instance name (an old version
kept alive by a request in flight, and the new one), and pids wrap (pid_max is 32768 here), so neither
"some stub has this name" nor "the higher pid is the newer" says which one serves the instance."""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from supervisor.processes import Identity, live_children, start_time

STUB_BINARY = "triton_python_backend_stub"
_INSTANCE = re.compile(r"^(?P<model>.+)_\d+_\d+$")


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


def scan_stub_pids(server_pid: int) -> dict[int, str]:
    """Live (non-zombie) stubs of this server: pid -> instance. Two stubs can serve one instance name for a
    while: a reload's new stub and the old version's, until Triton (or the supervisor) retires the old one."""
    children = live_children(server_pid)
    return {pid: instance for pid, argv in children.items() if (instance := instance_of(argv))}


def by_instance(stubs: dict[int, str], exclude=frozenset(),
                started: Callable[[int], float | None] = start_time) -> dict[str, int]:
    """instance -> pid of a scan, but the `exclude`d pids; of two stubs with one instance name, the one that
    started last (the newer: pids wrap, so their order says nothing)."""
    ordered = sorted(stubs.items(), key=lambda item: (started(item[0]) or 0, item[0]))
    return {instance: pid for pid, instance in ordered if pid not in exclude}


def of_model(stubs: dict[int, str], model: str) -> dict[int, str]:
    """The stubs of a scan that serve `model`'s instances."""
    return {pid: instance for pid, instance in stubs.items() if model_of(instance) == model}


def scan_stubs(server_pid: int) -> dict[str, int]:
    """Live stubs of this server: instance -> pid."""
    return by_instance(scan_stub_pids(server_pid))


def expected_instances(model: str, config: dict) -> set[str] | None:
    """The instance names the loaded configuration gives the model (`<group name>_<index>`, the group named
    `<model>_<group index>` unless the config names it), None if it declares no instance group."""
    groups = config.get("instance_group")
    if not groups:
        return None
    names: set[str] = set()
    for index, group in enumerate(groups):
        name = group.get("name") or f"{model}_{index}"
        names |= {f"{name}_{i}" for i in range(int(group.get("count", 1)))}
    return names


@dataclass
class StubTracker:
    """Feeds on successive scans; reports models whose stub died while the model is still READY.

    Each instance is followed through its newest stub (latest start time). That stub's end is no death if a
    newer stub serves the instance (a reload); otherwise it is one, even while an older stub still carries the
    name. A death is reported after it is seen on `confirm` consecutive scans, so that the short windows of a
    reload or an unload in progress are not mistaken for one; a model that is no longer READY (the gateway
    unloaded it) is forgotten, never healed; and an instance the loaded configuration no longer has (its
    count was lowered) is forgotten, never healed (`expected`, asked only when a death is about to be told)."""
    confirm: int = 2
    known: dict[str, Identity] = field(default_factory=dict)  # instance -> its newest stub last seen alive
    missing: dict[str, int] = field(default_factory=dict)  # instance -> consecutive scans seen dead

    def update(self, stubs: dict[int, str], ready_models: set[str],
               started: Callable[[int], float | None] = start_time,
               expected: Callable[[str], set[str] | None] | None = None) -> dict[str, str]:
        """Given a scan (pid -> instance), returns {model: reason} for the deaths confirmed by this scan."""
        alive: set[Identity] = set()
        newest: dict[str, Identity] = {}
        for pid, instance in stubs.items():
            began = started(pid)
            if began is None:  # exited since the scan
                continue
            alive.add((pid, began))
            if instance not in newest or began > newest[instance][1]:
                newest[instance] = (pid, began)
        deaths: dict[str, list[str]] = {}
        for instance, stub in list(self.known.items()):
            current = newest.get(instance)
            if model_of(instance) not in ready_models:
                self.forget(instance)
            elif current is not None and current[1] > stub[1]:  # a newer stub serves it (a reload)
                self.known[instance] = current
                self.missing.pop(instance, None)
            elif stub not in alive:  # its newest stub is gone and none newer came: older ones do not count
                self.missing[instance] = self.missing.get(instance, 0) + 1
                if self.missing[instance] >= self.confirm:
                    deaths.setdefault(model_of(instance), []).append(instance)
            else:
                self.missing.pop(instance, None)
        for instance, stub in newest.items():
            if instance not in self.known and model_of(instance) in ready_models:
                self.known[instance] = stub
        reasons: dict[str, str] = {}
        for model, instances in deaths.items():
            wanted = expected(model) if expected is not None else None
            if wanted is not None:
                for instance in [i for i in instances if i not in wanted]:
                    self.forget(instance)  # e.g. count lowered from 2 to 1: its stub ended with the old version
                instances = [i for i in instances if i in wanted]
            if instances:
                pid = self.known[instances[0]][0]
                reasons[model] = f"stub process {pid} of '{instances[0]}' died"
        return reasons

    def forget(self, instance: str) -> None:
        self.known.pop(instance, None)
        self.missing.pop(instance, None)

    def pids(self) -> set[int]:
        """The pids of the stubs followed (the newest of each instance)."""
        return {pid for pid, _ in self.known.values()}

    def instances(self, model: str) -> list[str]:
        return [i for i in self.known if model_of(i) == model]

    def healed(self, model: str) -> None:
        """After a reload whose stubs run again: the instances stay known (a stub that dies right after
        its heal is a new death), their count of missed scans restarts."""
        for instance in self.instances(model):
            self.missing.pop(instance, None)
