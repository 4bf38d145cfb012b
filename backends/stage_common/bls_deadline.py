"""Every BLS call has a deadline, and a front learns at once that its callee lost the call.

Triton 2.51 answers no request that was in flight on a stub that died (the generator, killed or OOM):
a BLS caller blocked in `exec` or in a decoupled response iterator waits forever, holding its worker
thread. A front's capacity then fills with such calls, and new requests queue behind them long after the
supervisor healed the callee (issue 35: DEADLINE_EXCEEDED minutes after a 3.7 s heal). The stub's
iterator has no timeout, so the call runs on a thread of its own and the caller waits for it with one:

- `deadline_s` bounds the whole wait (a callee alive but never answering: the caller fails and moves on);
- `first_deadline_s` bounds the wait for the call's first answer (a callee asked to acknowledge a call
  does so at once: one that does not, dead or stuck, is given up on within seconds);
- every `probe_every_s` without an answer, `probe()` asks the callee (a new, short call) whether it still
  holds this request; a "no" (or a callee that is not healthy) means the call is lost (its stub died, or a
  heal replaced it): after `grace_s` (an answer may be on its way) the caller fails at once.

`deadline_s` comes from the request where it says how long its client waits (`request_deadline_s`): a call
its client has given up on frees the front's worker then, not at the front's own longest wait.

A lost call's thread stays blocked in the stub's wait (nothing can wake it); it costs a thread, not a
worker slot. A call lost before its first answer also holds, on Triton's side, one thread of the front's
Python-backend pool (which waits for a call's first response, and which the front's response sends need
too). `StuckCalls` counts those, so that the supervisor can replace a front before its pool runs out (issue
48); a callee that acknowledges each call at once (`first`) leaves few of them. Triton-free: `run` and
`probe` are plain callables (the models wrap their BLS calls)."""
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


def _seconds(value: float) -> str:
    """A wait as people read it: what is left of a request's 0.5 s deadline reads 0.5, of 600 s 600."""
    return f"{round(value, 1) if value >= 1 else float(f'{value:.2g}'):g}"


def request_deadline_s(client_timeout_us: int, longest_s: float) -> float:
    """The longest wait for a request's BLS calls: the request's own timeout (Triton's `timeout` request
    parameter, in microseconds; 0 when its client set none) if shorter than the front's `longest_s`."""
    return min(longest_s, client_timeout_us / 1e6) if client_timeout_us > 0 else longest_s


class RequestDeadline:
    """When a request's client stops waiting: each BLS call made for the request waits at most what is left."""

    def __init__(self, client_timeout_us: int, longest_s: float):
        self.total_s = request_deadline_s(client_timeout_us, longest_s)
        self.at = time.monotonic() + self.total_s

    def left_s(self) -> float:
        return self.at - time.monotonic()


def call_with_deadline(run: Callable[[], T], what: str, deadline_s: float,
                       probe: Callable[[], bool] | None = None, probe_every_s: float = 2.0,
                       grace_s: float = 1.0, stuck: StuckCalls | None = None,
                       first: threading.Event | None = None, first_deadline_s: float | None = None,
                       first_probe_every_s: float = 0.5, unseen_after_s: float = 3.0) -> T:
    """run() on its own thread; its result (or its exception), else CallTimedOut / CallLost (then the call
    counts in `stuck` until its thread returns, if ever). `first`, set by run() at the call's first answer,
    is awaited at most `first_deadline_s`; until it comes the callee is probed every `first_probe_every_s`
    (a live callee acknowledges within milliseconds, so a call unacknowledged that long was likely sent to a
    stub that died), and a "no" fails the call at once (no answer of a call never taken can be on its way) once
    the call is `unseen_after_s` old (a younger one may still be on its way to the callee)."""
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
                if first is not None:
                    first.set()  # an error before any answer ends the wait for it too
                was_counted = bool(outcome.get("abandoned"))
            if was_counted and stuck is not None:
                stuck.add(-1)

    def give_up(error: Overloaded) -> Overloaded:
        with lock:
            # only a call still waiting for its first answer holds a thread of the caller's Triton-side pool;
            # one that was answered (acknowledged) keeps just its own thread here, blocked in the iterator
            blocked = not done.is_set() and (first is None or not first.is_set())
            outcome["abandoned"] = blocked
        if blocked and stuck is not None:
            stuck.add(1)
        return error

    threading.Thread(target=target, name=f"bls-call-{what}", daemon=True).start()
    started = time.monotonic()
    awaiting_first = first is not None and first_deadline_s is not None
    next_probe = started + (min(first_probe_every_s, probe_every_s) if awaiting_first else probe_every_s)
    while True:
        now = time.monotonic()
        if now - started >= deadline_s:
            raise give_up(CallTimedOut(f"{what} gave no answer in {_seconds(deadline_s)} s: retry later"))
        if awaiting_first and now - started >= first_deadline_s:
            raise give_up(CallTimedOut(f"{what} gave no answer in {_seconds(first_deadline_s)} s (it did not take the "
                                       "request): retry"))
        if probe is not None and now >= next_probe:
            if not probe():
                unanswered = awaiting_first and not first.is_set()
                # before its first answer the call may not have reached the callee yet: Triton hands each BLS
                # call over on a thread of its own, and under CPU pressure a probe sent later overtook it
                # (the soak, 2026-12-02): so a "no" then counts only for a call this old
                if not unanswered or now - started >= unseen_after_s:
                    if done.wait(0.0 if unanswered else grace_s):
                        break
                    raise give_up(CallLost(f"{what} lost the request (its process was restarted): retry"))
            awaiting_first = awaiting_first and not first.is_set()
            next_probe = time.monotonic() + (min(first_probe_every_s, probe_every_s) if awaiting_first
                                             else probe_every_s)
            continue
        until = started + (min(deadline_s, first_deadline_s) if awaiting_first else deadline_s)
        if probe is not None:
            until = min(until, next_probe)
        event = first if awaiting_first else done  # `first` is set by the end of the call too
        if event.wait(max(0.0, until - now)):
            if event is done:
                break
            awaiting_first = False
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["result"]  # type: ignore[return-value]
