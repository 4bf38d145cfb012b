"""Retiring the stubs a heal leaves behind: the old version's survivors.

A heal reloads the model, and Triton unloads the old version once its requests are done. But after a stub
died with requests in flight, Triton 2.51 never unloads that old version (seen with two encoder instances
under load: no "Stopping dynamic-batcher" for it until shutdown, which then waits its full exit timeout), so
the other instances' stubs of that version live on, each holding its model's memory, and a hung stub (healed
after its canary failed) stays alive too. Triton sends them no new request: new ones go to the new version.

So after a heal every stub of the model that was alive before the reload is an orphan. A BLS front publishes
its requests in flight (stage_common/in_flight_metric.py, read from /metrics by `in_flight`): its orphan is
killed once that count is 0 — a front waiting on its callee uses no CPU, so idle CPU would kill live streams
(issue 35). Another orphan is killed once it has used no CPU for `idle_s` (the requests it had when the reload
came are done; a normal unload ends its stub within ~2 s, before that). Either, at the latest, `max_age_s` after
the heal (a hung stub). Triton's own unload would end it too; the old version's Triton side is reclaimed at
shutdown."""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from supervisor.processes import cpu_time


@dataclass
class _Orphan:
    model: str
    adopted: float  # monotonic time of the heal
    cpu: float | None  # CPU seconds at the last change seen
    changed: float  # monotonic time of that change


class Orphans:
    def __init__(self, idle_s: float = 5.0, max_age_s: float = 120.0,
                 cpu: Callable[[int], float | None] = cpu_time,
                 kill: Callable[[int], None] = lambda pid: os.kill(pid, signal.SIGKILL),
                 clock: Callable[[], float] = time.monotonic,
                 in_flight: Callable[[], dict[int, int]] | None = None):
        self.idle_s, self.max_age_s = idle_s, max_age_s
        self._cpu, self._kill, self._clock = cpu, kill, clock
        self._in_flight = in_flight  # () -> {stub pid: requests in flight} of the stubs that count them
        self._orphans: dict[int, _Orphan] = {}

    def pids(self) -> set[int]:
        return set(self._orphans)

    def adopt(self, model: str, pids: set[int]) -> None:
        now = self._clock()
        for pid in pids:
            self._orphans[pid] = _Orphan(model, now, self._cpu(pid), now)

    def kill_now(self, pids: set[int]) -> list[int]:
        """Kill these stubs without waiting (a hung front's: nothing they hold can finish); the killed pids."""
        killed = []
        for pid in sorted(pids):
            self._orphans.pop(pid, None)
            try:
                self._kill(pid)
            except ProcessLookupError:
                continue
            killed.append(pid)
        return killed

    def retire(self, live: set[int]) -> list[tuple[str, int, str]]:
        """One round, given the pids of the server's live stubs: forgets the orphans that exited and kills the
        idle or overdue ones. Returns (model, pid, why) for each killed."""
        now, killed = self._clock(), []
        counts = self._counts() if self._orphans else {}
        for pid, orphan in list(self._orphans.items()):
            cpu = self._cpu(pid) if pid in live else None
            if cpu is None:  # exited: Triton unloaded the old version after all
                del self._orphans[pid]
                continue
            if cpu != orphan.cpu:
                orphan.cpu, orphan.changed = cpu, now
            if pid in counts:  # the stub's own count: CPU time says nothing of a wait on a callee
                if counts[pid] == 0:
                    why = "no request in flight"
                elif now - orphan.adopted >= self.max_age_s:
                    why = f"still {counts[pid]} request(s) in flight {now - orphan.adopted:.0f} s after the reload"
                else:
                    continue
            elif now - orphan.changed >= self.idle_s:
                why = f"idle for {now - orphan.changed:.1f} s"
            elif now - orphan.adopted >= self.max_age_s:
                why = f"still busy {now - orphan.adopted:.0f} s after the reload"
            else:
                continue
            del self._orphans[pid]
            try:
                self._kill(pid)
            except ProcessLookupError:
                continue
            killed.append((orphan.model, pid, why))
        return killed

    def _counts(self) -> dict[int, int]:
        if self._in_flight is None:
            return {}
        try:
            return self._in_flight()
        except Exception:  # noqa: BLE001 - metrics unreachable: the CPU rule applies
            return {}


def read_in_flight(metrics_url: str, timeout_s: float = 2.0, family: str | None = None) -> dict[int, int]:
    """{stub pid: requests in flight} from Triton's /metrics (the BLS fronts' gauge, or another per-stub one)."""
    import urllib.request

    from supervisor.metrics_text import gauge_by_label

    with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:
        text = response.read().decode(errors="replace")
    return {int(pid): int(value) for pid, value in gauge_by_label(text, family or IN_FLIGHT_FAMILY, "stub_pid").items()}


def read_stuck_calls(metrics_url: str) -> dict[int, int]:
    """{stub pid: generator calls given up on that still block} (codegen_common/bls_client.py's gauge)."""
    return read_in_flight(metrics_url, family=STUCK_FAMILY)


IN_FLIGHT_FAMILY = "bls_front_requests_in_flight"  # stage_common/in_flight_metric.py's FAMILY
STUCK_FAMILY = "bls_front_calls_stuck"  # codegen_common/bls_client.py's STUCK_FAMILY
