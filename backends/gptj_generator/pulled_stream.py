"""Streams whose chunks the caller fetches: every BLS call into the generator gets exactly one response.

Why: Triton 2.51's stub (python_backend r24.10) can deadlock a BLS caller that reads a decoupled stream
of several responses (README, "A python_backend bug"): a reader woken in next() holds its iterator's
mutex while it waits for the GIL, and the stub thread delivering the stream's *next* response waits for
that mutex while holding the iterator map's mutex, which the cleanup of another finished stream needs,
under the queue mutex the GIL holder waits for. With one response per call no response is ever
delivered to an iterator that already has a reader, so that cycle cannot form. codegen_stream asks the
generator for a pulled stream: the generation request is answered with the first chunk, and each
`fetch` request (same request_id) with every id released since the last one.

Triton-free (the model adapts): a `Reply` is whatever the adapter sends on a fetch's sender."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from stage_common.errors import BadInput


@dataclass
class Chunk:
    """What one fetch returns: ids released since the last fetch, the count so far, and the finish
    reason (None until the stream's end) or the error that ended it."""
    token_ids: list[int]
    completion_tokens: int
    finish_reason: str | None = None
    error: BaseException | None = None
    logprobs: list | None = None  # one TokenLogprob per id, for requests that asked
    prompt_logprobs: list | None = None  # the prompt's, in the first chunk of a request with prompt_logprobs

    @property
    def last(self) -> bool:
        return self.finish_reason is not None or self.error is not None


Deliver = Callable[[object, Chunk], None]  # (a fetch's sender, its chunk): sends one final response


class PulledStream:
    """The engine's sink for one pulled request. The decode loop appends; a fetch takes everything
    appended so far, or waits (its sender parked) until the loop appends something."""

    def __init__(self, deliver: Deliver, first_sender, abandon_after_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self._deliver, self._clock, self._abandon_after_s = deliver, clock, abandon_after_s
        self._lock = threading.Lock()
        self._ids: list[int] = []
        self._count = 0
        self._reason: str | None = None
        self._error: BaseException | None = None
        self._logprobs: list | None = None  # of the ids not yet delivered (requests that asked)
        self._prompt_logprobs: list | None = None
        self._waiting = first_sender  # the generation request itself waits for the first chunk
        # when the caller last had no call waiting here: set on each delivery, not at creation, so that the
        # time a request waits for a row (its first call parked all along) never counts as abandonment
        self._answered_at = clock()
        self.delivered_last = False

    # -- the engine's Sink
    def send(self, token_ids: list[int], logprobs: list | None = None, prompt_logprobs: list | None = None) -> None:
        self._append(token_ids, logprobs=logprobs, prompt_logprobs=prompt_logprobs)

    def finish(self, reason: str, token_ids: list[int], logprobs: list | None = None,
               prompt_logprobs: list | None = None) -> None:
        self._append(token_ids, reason=reason, logprobs=logprobs, prompt_logprobs=prompt_logprobs)

    def fail(self, error: BaseException) -> None:
        self._append([], error=error)

    def cancelled(self) -> bool:
        """A caller that stopped fetching (its stub died) does not keep a row: the request ends. Only the
        time since its last answer counts (a call parked here, e.g. waiting for a row, is a caller waiting)."""
        with self._lock:
            return self._waiting is None and self._clock() - self._answered_at > self._abandon_after_s

    # -- the caller's side
    def fetch(self, sender) -> None:
        """Answer this fetch now if anything is there, else when the loop releases something."""
        with self._lock:
            if self.delivered_last:
                raise BadInput("no open stream has this request_id: its last chunk was delivered")
            if self._waiting is not None:
                raise BadInput("a fetch for this stream is already waiting: fetch one chunk at a time")
            self._waiting = sender
            ready = self._take_locked()
        if ready:
            self._deliver(*ready)

    def abandoned(self) -> bool:
        """Ended and not fetched for abandon_after_s: the caller will not come back for it."""
        with self._lock:
            return (self._reason is not None or self._error is not None) and self._waiting is None \
                and self._clock() - self._answered_at > self._abandon_after_s

    def _append(self, token_ids: list[int], reason: str | None = None, error: BaseException | None = None,
                logprobs: list | None = None, prompt_logprobs: list | None = None) -> None:
        with self._lock:
            self._ids += token_ids
            if logprobs is not None:
                self._logprobs = (self._logprobs or []) + logprobs
            if prompt_logprobs is not None:
                self._prompt_logprobs = prompt_logprobs
            self._count += len(token_ids)
            if reason is not None and self._reason is None and self._error is None:
                self._reason = reason
            if error is not None and self._reason is None:
                self._error = error
            ready = self._take_locked()
        if ready:
            self._deliver(*ready)  # outside the lock: a send is a round trip to the server

    def _take_locked(self) -> tuple[object, Chunk] | None:
        """The parked sender and everything not yet delivered, if there is a sender and something new."""
        if self._waiting is None or self.delivered_last:
            return None
        if not self._ids and self._reason is None and self._error is None and self._prompt_logprobs is None:
            return None
        chunk = Chunk(self._ids, self._count, self._reason, self._error, self._logprobs, self._prompt_logprobs)
        sender, self._waiting, self._ids = self._waiting, None, []
        self._logprobs = [] if self._logprobs is not None else None
        self._prompt_logprobs = None
        self._answered_at = self._clock()
        self.delivered_last = chunk.last
        return sender, chunk


class PulledStreams:
    """The generator's open pulled streams by request key."""

    def __init__(self):
        self._lock = threading.Lock()
        self._streams: dict[str, PulledStream] = {}

    def open(self, key: str | None, stream: PulledStream) -> None:
        if not key:
            raise BadInput("a pulled stream needs a request_id (its fetches name it)")
        with self._lock:
            self._purge_locked()
            if key in self._streams:
                raise BadInput(f"request_id '{key}' already names an open stream")
            self._streams[key] = stream

    def close(self, key: str | None) -> None:
        """Forget a stream that could not start."""
        with self._lock:
            self._streams.pop(key, None)

    def fetch(self, key: str | None, sender) -> None:
        with self._lock:
            stream = self._streams.get(key or "")
        if stream is None:
            raise BadInput(f"no open stream has request_id '{key}'")
        stream.fetch(sender)
        if stream.delivered_last:
            with self._lock:
                self._streams.pop(key, None)

    def __contains__(self, key: str) -> bool:
        """An open stream (its last chunk not yet delivered) has this key."""
        with self._lock:
            stream = self._streams.get(key)
        return stream is not None and not stream.delivered_last

    def __len__(self) -> int:
        with self._lock:
            return len(self._streams)

    def _purge_locked(self) -> None:
        for key in [k for k, s in self._streams.items() if s.abandoned() or s.delivered_last]:
            del self._streams[key]
