"""What every engine's loop shares (torch_engine.py, openvino_engine.py): the seam's requests side (checking a request
against seam.Limits, its Delivery, the queue of requests waiting for a row and its bound, `holds`, stopping requests
by key), the turn a loop takes (who is admitted, which keys were cancelled, whether sinks are asked if their client
left), the statistics each turn adds to, and closing.

An engine subclasses EngineLoop, sets `context_window` and `vocab_size`, calls `_start_loop(...)` once its model is
ready, and implements `running` (requests holding a row), `_holding()` (their queue entries), `_loop()` (turns
until `_next_turn()` returns None) and what a turn does; `_entry` may wrap a request's Delivery with the engine's
own state (the torch engine: its random generator and cache position)."""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

from gptj_generator.delivery import Delivery
from gptj_generator.healing import AllowedIds
from gptj_generator.seam import MAX_TOP_LOGPROBS, EngineStats, GenerationRequest, Limits, Sink
from stage_common.errors import Overloaded

_log = logging.getLogger("stage")


@dataclass
class Turn:
    admitted: list  # taken from the queue (and the waiting ones stopped by key, which admission ends)
    cancelled_keys: set[str]
    poll: bool  # ask each sink whether its client left
    started: float  # perf_counter


class EngineLoop:
    name = "?"
    max_top_logprobs = MAX_TOP_LOGPROBS  # alternatives per token: every engine here has the logits to give them
    context_window: int
    vocab_size: int

    def _start_loop(self, thread_name: str, *, token_bytes: Sequence[bytes], eos: int | None, max_batch_size: int,
                    max_tokens_limit: int, max_pending: int, max_stop_words: int, max_stop_word_chars: int,
                    on_progress: Callable | None, cancel_poll_seconds: float) -> None:
        self.token_bytes, self.eos = token_bytes, eos  # every request's Delivery streams and ends by them
        self.allowed_ids = AllowedIds(token_bytes)  # token healing's constraint
        # what every request is checked against at submit: a bad one fails alone, never the batch it would join
        self.limits = Limits(self.context_window, self.vocab_size, max_tokens_limit, max_stop_words,
                             max_stop_word_chars, self.max_top_logprobs)
        self.max_tokens_limit = max_tokens_limit
        self.max_batch_size = max_batch_size  # rows decoded together; more requests wait for one
        self.max_pending = max_pending  # requests waiting for a row; over it submit refuses (Overloaded)
        self.on_progress = on_progress  # called after every loop turn (statistics)
        # asking a sink whether its client left costs a round trip to the server: every turn (0) or less often
        self.cancel_poll_seconds, self._polled_at = cancel_poll_seconds, 0.0
        self._wakeup = threading.Condition()
        self._pending: deque = deque()
        self._admitting: list = []  # taken from the queue, not yet running (never lost in between)
        self._cancelled_keys: set[str] = set()
        self._stopping = False
        self.steps = 0  # batched forward passes, for the statistics
        self.rows_decoded = 0
        self.busy_seconds = 0.0  # time spent in turns: prefilling, decoding, sampling
        # each turn's time once for every sequence in it: what Triton's per-request compute statistics would show
        # for a model batched per execution (the seed's share metric)
        self.request_seconds = 0.0
        self.restarts = 0  # times a failure failed every running request and the engine went on
        self._thread = threading.Thread(target=self._run_loop, name=thread_name, daemon=True)
        self._thread.start()

    @property
    def running(self) -> int:
        raise NotImplementedError

    def _loop(self) -> None:
        raise NotImplementedError

    def _run_loop(self) -> None:
        self._loop()

    def _holding(self) -> list:
        """The entries of the requests holding a row (being admitted, fed or decoding). Under `_wakeup`."""
        raise NotImplementedError

    # ---- the seam ------------------------------------------------------------------------------------------
    def validate(self, request: GenerationRequest) -> None:
        # composing models are public: an id outside the vocabulary would fail the whole batch's forward
        self.limits.check(request)

    def submit(self, request: GenerationRequest, sink: Sink) -> None:
        """Queue a request (BadInput if it is unusable, Overloaded if too many wait for a row already); the loop
        takes it at its next turn."""
        self.validate(request)
        delivery = Delivery(request, sink, self.token_bytes, self.eos, self.allowed_ids)
        self._enqueue(self._entry(delivery), delivery)

    def _entry(self, delivery: Delivery):
        """What the queue holds for a request (it has `key` and `ended`): its delivery, or the engine's wrapper."""
        return delivery

    def holds(self, key: str) -> bool:
        """Whether a request submitted with this key is still here (waiting, admitted, fed or decoding): a BLS
        caller's probe, which tells a slow answer from one that will never come."""
        with self._wakeup:
            entries = list(self._pending) + list(self._admitting) + self._holding()
        return any(entry.key == key and not entry.ended for entry in entries)

    def _enqueue(self, entry, delivery) -> None:
        """Queue an entry (its delivery announces it), or refuse it when too many wait for a row already."""
        with self._wakeup:
            if len(self._pending) >= self.max_pending:
                raise Overloaded(f"the generator has {len(self._pending)} requests waiting for a row, its limit "
                                 f"(max_pending_requests): retry later")
            delivery.queued()  # before the loop can see it: events come in order
            self._pending.append(entry)
            self._wakeup.notify()

    def cancel(self, key: str) -> None:
        """Stop the request submitted with this key (running or waiting) at the loop's next turn."""
        with self._wakeup:
            self._cancelled_keys.add(key)
            self._wakeup.notify()

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def active(self) -> int:
        return self.running + self.pending

    def stats(self) -> EngineStats:
        return EngineStats(self.running, self.pending, self.steps, self.rows_decoded, self.busy_seconds,
                           self.request_seconds, self.restarts)

    def close(self) -> None:
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()
        self._thread.join()

    # ---- a turn --------------------------------------------------------------------------------------------
    def _next_turn(self) -> Turn | None:
        """Wait for work; None once closing. Admits as many waiting requests as there are free rows."""
        with self._wakeup:
            while not self._stopping and not self.running and not self._pending:
                self._cancelled_keys.clear()  # nothing left that they could name
                self._wakeup.wait()
            if self._stopping:
                return None
            admitted = self._take_admissible(self.max_batch_size - self.running)
            keys, self._cancelled_keys = self._cancelled_keys, set()
            if keys:  # waiting ones are dropped too (admission ends them)
                admitted += [entry for entry in self._pending if entry.key in keys]
                self._pending = deque(entry for entry in self._pending if entry.key not in keys)
            self._admitting = admitted
        started = time.perf_counter()
        poll = started - self._polled_at >= self.cancel_poll_seconds
        self._polled_at = started if poll else self._polled_at
        return Turn(admitted, keys, poll, started)

    def _take_admissible(self, room: int) -> list:
        """Up to `room` waiting requests, oldest first, that `_may_run` lets in this turn; those it holds back keep
        their place (a later request that needs nothing they wait for goes ahead of them). Under `_wakeup`."""
        admitted: list = []
        held: deque = deque()
        while self._pending and len(admitted) < room:
            entry = self._pending.popleft()
            (admitted if self._may_run(entry, admitted) else held).append(entry)
        held.extend(self._pending)
        self._pending = held
        return admitted

    def _may_run(self, entry, admitted: list) -> bool:
        """Whether a waiting request may take a free row this turn, beside those `admitted` already: an engine
        bounds here what some requests cost their batch-mates beyond a row (OpenVINO: its scorer's work)."""
        return True

    def _end_turn(self, turn: Turn, taking_part: int) -> None:
        elapsed = time.perf_counter() - turn.started
        self.busy_seconds += elapsed
        self.request_seconds += elapsed * taking_part
        if self.on_progress is not None:
            try:
                self.on_progress(self)
            except Exception:  # noqa: BLE001 - statistics must never stop the generation
                _log.exception("codegen progress callback failed (ignored)")
