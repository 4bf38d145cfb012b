"""Keeping Triton 2.51's stub health check true under CPU contention: each stub's health thread runs real-time.

python_backend r24.10 waits for a stub's answer in turns of 1 s (`StubLauncher::ReceiveMessageFromStub`): before
each turn the server clears the stub's health flag, and the stub's health thread sets it again every 300 ms. A turn
that ends with no answer *and* the flag still clear fails the call with "Stub process '...' is not healthy" while
the stub is still working on it. The stub's answer then lands in the queue the server reads for the next call,
every later call reads the one before's, and the two sides free each other's shared memory: the stub soon dies by
SIGSEGV in `IPCMessage::LoadFromSharedMemory` (a handle past its 1 MiB pool) and the server aborts on Triton's
`boost::interprocess::lock_exception`. Seen (2026-12-02, docs/operations.md "The stubs' health threads"): the
soak's codegen server, whose session yields the CPU to the encoders' (CODEGEN_NICE), had the generator's stub
wait up to 1.05 s for a CPU; a codegen server at nice 19 beside two busy processes failed calls "not healthy"
and lost its generator within 45 s; a 2.5 s SIGSTOP of the generator's stub did the same at once.

A thread that runs for microseconds every 300 ms needs no share of the CPU, only to be run when it wakes. Under
CFS group scheduling it may not be: a session's share on a CPU follows its load there, and a thread that only
wakes on a CPU where its session has no other work gets almost none of it. SCHED_FIFO at the lowest real-time
priority takes it out of that sharing. Nothing else of the stub changes. Setting it needs CAP_SYS_NICE (root
has it) or an RLIMIT_RTPRIO of at least 1 (deploy/compose.yaml gives its servers, which run as uid 1000, rtprio 1;
Kubernetes has no per-pod rlimit); where neither holds, the supervisor says so once and goes on.

The health thread is found by what it is: the stub's first thread after the main one (created in the stub's
`main()` before any model code runs), asleep in `nanosleep` between its updates (the stub's other threads wait
on futexes); a stub's threads are read from /proc."""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from supervisor.processes import Identity, identity

log = logging.getLogger("supervisor")
PRIORITY = 1  # the lowest SCHED_FIFO priority: above every ordinary thread, below the kernel's own
SLEEPING = ("nanosleep",)  # /proc/<tid>/wchan of a thread asleep in (clock_)nanosleep: hrtimer_nanosleep, do_nanosleep


def _thread_start(pid: int, tid: int) -> int | None:
    """The thread's start time in clock ticks after boot (field 22 of its stat), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _wchan(pid: int, tid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{tid}/wchan").read_text()
    except OSError:
        return ""


def health_thread(pid: int) -> int | None:
    """The tid of the stub's health thread: of its threads but the main one, the first started (ties: the lower
    tid), if it sleeps in nanosleep; None if the process is gone or its first thread is not asleep that way."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
    except OSError:
        return None
    started = [(start, tid) for tid in tids if (start := _thread_start(pid, tid)) is not None]
    if not started:
        return None
    first = min(started)[1]
    return first if any(word in _wchan(pid, first) for word in SLEEPING) else None


def prioritize(tid: int) -> bool:
    """SCHED_FIFO at PRIORITY for this thread; False where this process may not (no CAP_SYS_NICE, RLIMIT_RTPRIO 0).
    Raises ProcessLookupError if the thread is gone."""
    try:
        os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(PRIORITY))
    except PermissionError:
        return False
    return True


class HealthThreads:
    """The supervisor's side: every stub it sees gets its health thread prioritized once. A stub whose health
    thread is not there yet (it starts ~70 ms after the stub) is tried again on the next scan."""

    def __init__(self) -> None:
        self.done: set[Identity] = set()
        self.denied = False  # said once: this process may not set real-time priorities

    def update(self, pids: Iterable[int]) -> list[int]:
        """Prioritizes the health threads of the stubs not seen before; returns the tids it prioritized."""
        stubs = {pid: who for pid in pids if (who := identity(pid)) is not None}
        self.done &= set(stubs.values())  # forget the stubs that are gone
        prioritized = []
        for pid, who in stubs.items():
            if who in self.done or self.denied or (tid := health_thread(pid)) is None:
                continue
            try:
                allowed = prioritize(tid)
            except ProcessLookupError:
                continue
            self.done.add(who)
            if allowed:
                prioritized.append(tid)
                continue
            self.denied = True
            log.warning("supervisor: may not give the stubs' health threads real-time priority (no CAP_SYS_NICE, "
                        "RLIMIT_RTPRIO 0): under CPU contention Triton 2.51 may take a starved stub for dead while "
                        "it works, and crash it (docs/operations.md, \"The stubs' health threads\")")
        return prioritized
