"""Closed-loop load, the one loop every bench drives: `concurrency` clients, each sending its next request as soon
as its last one ended, over a request function the caller supplies (an async one on an event loop: `run_async`;
a blocking one on threads: `run_threads`, or `Background` for a load that runs while the caller does something
else). The request function gets a `Call` (which request, which client) and either returns (its value is kept)
or raises (the error is recorded, the load goes on).

The loop stops starting requests when one of these is reached: `duration` seconds after the warm-up, `count`
requests started, or a stop (`Background.stop`). Every request that ends is recorded (start, end, ok, error,
value) in `Run.every`; `Run.records` are those that ended inside the measured window, from the end of the
warm-up to the end of the duration, as perf_analyzer counts responses: counting only requests that also
started inside the window would undercount long requests. A rate is `len(records) / seconds`; a latency
percentile is `bench.stats.percentile` of the records' latencies."""
from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from bench import stats


@dataclass(frozen=True)
class Call:
    index: int  # the order in which requests were started, across clients, from 0
    worker: int  # which client, from 0
    turn: int  # this client's requests before this one


@dataclass
class Record:
    index: int
    worker: int
    turn: int
    start: float
    end: float
    error: str | None = None  # None: the request function returned
    value: Any = None  # what it returned

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def latency(self) -> float:
        return self.end - self.start


class Failed(Exception):
    """A failure the request function found itself (an HTTP status, a refusal in a stream): recorded with its
    message as it is, where any other exception is recorded as "<type>: <message>"."""


def describe(error: BaseException) -> str:
    return str(error) if isinstance(error, Failed) else f"{type(error).__name__}: {error}"


@dataclass
class Run:
    started: float
    window_from: float  # the end of the warm-up
    window_to: float  # the end of the duration; with none, the end of the run (inf while it runs)
    every: list[Record] = field(default_factory=list)  # every request that ended, in the order they ended
    ended: float = math.nan

    @property
    def records(self) -> list[Record]:
        """The requests that ended inside the measured window."""
        return [r for r in self.every if self.window_from <= r.end <= self.window_to]

    @property
    def seconds(self) -> float:
        return self.window_to - self.window_from

    @property
    def latencies(self) -> list[float]:
        """Seconds, the window's successful requests only."""
        return [r.latency for r in self.records if r.ok]

    @property
    def errors(self) -> int:
        return sum(not r.ok for r in self.records)

    @property
    def first_error(self) -> str:
        return next((r.error for r in self.every if not r.ok), "")


class _Plan:
    """What the clients share: the clock, the stop rules, the counter of requests and the run's records."""

    def __init__(self, concurrency: int, duration: float | None, warmup: float, count: int | None,
                 clock: Callable[[], float], describe_error: Callable[[BaseException], str],
                 on_record: Callable[[Record], None] | None, stop: threading.Event | None = None):
        if duration is None and count is None and stop is None:
            raise ValueError("a closed loop needs a duration or a count (or, in the background, a stop)")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        self.concurrency, self.count, self.clock = concurrency, count, clock
        self.describe, self.on_record, self.stop = describe_error, on_record, stop
        started = clock()
        self.deadline = started + warmup + duration if duration is not None else math.inf
        self.run = Run(started, started + warmup, self.deadline)
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def next_call(self, worker: int, turn: int) -> Call | None:
        if (self.stop is not None and self.stop.is_set()) or self.clock() >= self.deadline:
            return None
        with self._lock:
            index = next(self._counter)
        return None if self.count is not None and index >= self.count else Call(index, worker, turn)

    def record(self, call: Call, start: float, error: BaseException | None, value: Any) -> Record:
        record = Record(call.index, call.worker, call.turn, start, self.clock(),
                        None if error is None else self.describe(error), value)
        self.run.every.append(record)  # list.append is atomic: the clients' threads need no lock here
        if self.on_record is not None:
            self.on_record(record)
        return record

    def finish(self) -> Run:
        self.run.ended = self.clock()
        if math.isinf(self.run.window_to):
            self.run.window_to = self.run.ended
        return self.run


async def run_async(request: Callable[[Call], Awaitable[Any]], concurrency: int, *, duration: float | None = None,
                    warmup: float = 0.0, count: int | None = None, clock: Callable[[], float] = time.perf_counter,
                    describe_error: Callable[[BaseException], str] = describe,
                    on_record: Callable[[Record], None] | None = None) -> Run:
    """`concurrency` clients on this event loop, each awaiting `request(call)` back to back."""
    plan = _Plan(concurrency, duration, warmup, count, clock, describe_error, on_record)

    async def client(worker: int) -> None:
        for turn in itertools.count():
            call = plan.next_call(worker, turn)
            if call is None:
                return
            start, error, value = clock(), None, None
            try:
                value = await request(call)
            except Exception as e:  # noqa: BLE001 - recorded, the load goes on
                error = e
            plan.record(call, start, error, value)

    await asyncio.gather(*(client(w) for w in range(concurrency)))
    return plan.finish()


class Background:
    """`concurrency` threads, each calling `request(call)` back to back, while the caller goes on. `stop()` lets
    the requests in flight end; `pause_after_error(record)` gives the seconds a client waits after a failed request
    (e.g. a server restarting: the shared box's cores are not spun on), None or 0 for none."""

    def __init__(self, request: Callable[[Call], Any], concurrency: int, *, duration: float | None = None,
                 warmup: float = 0.0, count: int | None = None, clock: Callable[[], float] = time.perf_counter,
                 describe_error: Callable[[BaseException], str] = describe,
                 on_record: Callable[[Record], None] | None = None,
                 pause_after_error: Callable[[Record], float] | None = None):
        self._request, self._pause = request, pause_after_error
        self._stop = threading.Event()
        self._args = (concurrency, duration, warmup, count, clock, describe_error, on_record, self._stop)
        self._threads: list[threading.Thread] = []
        self._plan: _Plan | None = None

    @property
    def run(self) -> Run:
        assert self._plan is not None, "not started"
        return self._plan.run

    def start(self) -> "Background":
        self._plan = _Plan(*self._args)
        self._threads = [threading.Thread(target=self._client, args=(w,), daemon=True)
                         for w in range(self._plan.concurrency)]
        for thread in self._threads:
            thread.start()
        return self

    def _client(self, worker: int) -> None:
        plan = self._plan
        for turn in itertools.count():
            call = plan.next_call(worker, turn)
            if call is None:
                return
            start, error, value = plan.clock(), None, None
            try:
                value = self._request(call)
            except Exception as e:  # noqa: BLE001 - recorded, the load goes on
                error = e
            record = plan.record(call, start, error, value)
            if error is not None and self._pause is not None and (pause := self._pause(record)):
                self._stop.wait(pause)

    def join(self, timeout: float | None = None) -> list[int]:
        """Waits for the clients to end (all of them within `timeout` seconds, if given); -> the clients still
        running then."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        busy = [w for w, thread in enumerate(self._threads) if thread.is_alive()]
        if not busy:
            self._plan.finish()
        return busy

    def stop(self, grace_s: float | None = None) -> list[int]:
        """No new request starts; waits for those in flight (at most `grace_s` seconds in all, if given). -> the
        clients still in a request after it (a hung request never hides as a missing record: the caller
        records them)."""
        self._stop.set()
        busy = self.join(grace_s)
        if busy:
            self._plan.finish()
        return busy

    def __enter__(self) -> "Background":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def run_threads(request: Callable[[Call], Any], concurrency: int, **options) -> Run:
    """`concurrency` threads, each calling `request(call)` back to back, until the duration or count is reached
    (Background's options)."""
    if options.get("duration") is None and options.get("count") is None:
        raise ValueError("a closed loop needs a duration or a count")
    background = Background(request, concurrency, **options).start()
    background.join()
    return background.run


@dataclass
class LoadResult:
    """A closed loop's figures, as bench/perf.py prints them (perf_analyzer's layout)."""
    model: str
    concurrency: int
    seconds: float
    latencies: list[float] = field(default_factory=list)  # seconds, successful requests only
    errors: int = 0
    rows_per_request: int = 1
    first_error: str = ""
    server: dict[str, dict] = field(default_factory=dict)  # model -> breakdown (bench/perf.py server_breakdown)

    @classmethod
    def of(cls, label: str, concurrency: int, run: Run, rows_per_request: int = 1,
           server: dict[str, dict] | None = None) -> "LoadResult":
        return cls(label, concurrency, run.seconds, run.latencies, run.errors, rows_per_request, run.first_error,
                   server or {})

    @property
    def throughput(self) -> float:
        """Inferences (batch rows) per second, as perf_analyzer counts them."""
        return len(self.latencies) * self.rows_per_request / self.seconds

    def percentile(self, p: float) -> float:
        return stats.percentile(self.latencies, p)
