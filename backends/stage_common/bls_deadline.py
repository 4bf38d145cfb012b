"""Every BLS call has a deadline, and a front learns at once that its callee lost the call.

Triton 2.51 answers no request that was in flight on a stub that died (the generator, killed or OOM):
a BLS caller blocked in `exec` or in a decoupled response iterator waits forever, holding its worker
thread. A front's capacity then fills with such calls, and new requests queue behind them long after the
supervisor healed the callee (issue 35: DEADLINE_EXCEEDED minutes after a 3.7 s heal). The stub's
iterator has no timeout, so the call runs on a thread of its own and the caller waits for it with one:

- `deadline_s` bounds the whole wait (a callee alive but never answering: the caller fails and moves on);
- every `probe_every_s` without an answer, `probe()` asks the callee (a new, short call) whether it still
  holds this request; a "no" (or a callee that is not healthy) means the call is lost (its stub died, or a
  heal replaced it): after `grace_s` (an answer may be on its way) the caller fails at once.

A lost call's thread stays blocked in the stub's wait (nothing can wake it); it costs a thread, not a
worker slot, and on Triton's side one thread of the front's Python-backend pool (which waits for the call's
first response, and which the front's response sends need too). `StuckCalls` counts them, so that the
supervisor can replace a front before its pool runs out (issue 48). Triton-free: `run` and `probe` are plain
callables (the models wrap their BLS calls)."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from stage_common.errors import Overloaded

T = TypeVar("T")


class CallTimedOut(Overloaded):
    """The callee gave no answer within the deadline: UNAVAILABLE, the client may retry."""


class CallLost(Overloaded):
    """The callee no longer holds the call (its stub died or was replaced): UNAVAILABLE, retry."""


class StuckCalls:
    """How many calls their callers gave up on are still blocked (each holds a thread until its answer, which
    after a callee's death never comes); `on_change(n)` is told each new count (a gauge)."""

    def __init__(self, on_change: Callable[[int], None] | None = None):
        self._lock = threading.Lock()
        self.count = 0
        self._on_change = on_change

    def add(self, n: int) -> None:
        with self._lock:
            self.count += n
            count = self.count
        if self._on_change is not None:
            try:
                self._on_change(count)
            except Exception:  # noqa: BLE001 - a metric must never fail a request
                pass


def call_with_deadline(run: Callable[[], T], what: str, deadline_s: float,
                       probe: Callable[[], bool] | None = None, probe_every_s: float = 2.0,
                       grace_s: float = 1.0, stuck: StuckCalls | None = None) -> T:
    """run() on its own thread; its result (or its exception), else CallTimedOut / CallLost (then the call
    counts in `stuck` until its thread returns, if ever)."""
    outcome: dict[str, object] = {}
    done = threading.Event()
    lock = threading.Lock()  # the caller's giving up and the thread's return, in one order

    def target() -> None:
        try:
            outcome["result"] = run()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome["error"] = exc
        finally:
            with lock:
                done.set()
                was_counted = bool(outcome.get("abandoned"))
            if was_counted and stuck is not None:
                stuck.add(-1)

    def give_up(error: Overloaded) -> Overloaded:
        with lock:
            blocked = not done.is_set()
            outcome["abandoned"] = blocked
        if blocked and stuck is not None:
            stuck.add(1)
        return error

    threading.Thread(target=target, name=f"bls-call-{what}", daemon=True).start()
    started = time.monotonic()
    while True:
        remaining = deadline_s - (time.monotonic() - started)
        if remaining <= 0:
            raise give_up(CallTimedOut(f"{what} gave no answer in {deadline_s:g} s: retry later"))
        wait = remaining if probe is None else min(probe_every_s, remaining)
        if done.wait(wait):
            break
        if probe is not None and not probe() and not done.wait(grace_s):
            raise give_up(CallLost(f"{what} lost the request (its process was restarted): retry"))
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["result"]  # type: ignore[return-value]
