"""Running a request's sequences on `codegen_stream`, all in flight at once (the generator batches
them per decode step): their pieces merged in arrival order, or gathered into whole choices. Leaving
early (an error, a closed stream, a cancelled task) cancels every gRPC call still running, so each
sequence leaves the generator's batch."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import AsyncIterator

import numpy as np

from gateway.completions.shapes import joined
from gateway.completions.tensors import STREAM_MODEL, Sequence
from gateway.errors import BadRequest
from gateway.triton.engine import StreamResponse

_DONE = object()


@dataclass
class Piece:
    index: int
    text: str
    finish_reason: str | None  # set on the sequence's last piece only
    prompt_tokens: int
    completion_tokens: int  # generated so far
    logprobs: dict | None = None  # OpenAI's logprobs object of this piece (offsets from its start), when asked


@dataclass
class Choice:
    index: int
    prompt_index: int
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    logprobs: dict | None = None


def _scalar(outputs: dict[str, np.ndarray], name: str):
    array = outputs.get(name)
    return None if array is None or array.size == 0 else array.reshape(-1)[0]


def _text(value) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


class _Tracker:
    """One sequence's counts across its responses (an empty final response carries none)."""

    def __init__(self, index: int, max_tokens: int):
        self.index, self.max_tokens = index, max_tokens
        self.prompt_tokens = self.completion_tokens = 0
        self.finish_reason = ""

    def piece(self, response: StreamResponse) -> Piece | None:
        out = response.outputs
        prompt_tokens, completion_tokens = _scalar(out, "prompt_tokens"), _scalar(out, "completion_tokens")
        self.prompt_tokens = int(prompt_tokens) if prompt_tokens is not None else self.prompt_tokens
        self.completion_tokens = int(completion_tokens) if completion_tokens is not None else self.completion_tokens
        self.finish_reason = _text(_scalar(out, "finish_reason")) or self.finish_reason
        text = _text(_scalar(out, "text_output"))
        logprobs = _text(_scalar(out, "logprobs"))
        logprobs = json.loads(logprobs) if logprobs else None
        if not response.final:
            return Piece(self.index, text, None, self.prompt_tokens, self.completion_tokens, logprobs) \
                if text or logprobs else None
        # the contract puts the reason on the last response; a bare FINAL flag after it keeps the one seen
        reason = self.finish_reason or ("length" if self.completion_tokens >= self.max_tokens else "stop")
        return Piece(self.index, text, reason, self.prompt_tokens, self.completion_tokens, logprobs)


def _coalesced(pieces: list[Piece]) -> list[Piece]:
    """One piece per sequence from pieces that arrived together (in order): under load the gateway then
    writes one event per sequence per turn of its loop instead of one per generated piece."""
    merged: dict[int, Piece] = {}
    for piece in pieces:
        seen = merged.get(piece.index)
        if seen is None:
            merged[piece.index] = Piece(piece.index, piece.text, piece.finish_reason, piece.prompt_tokens,
                                        piece.completion_tokens, piece.logprobs)
        else:
            seen.logprobs = joined(seen.logprobs, piece.logprobs, len(seen.text))
            seen.text += piece.text
            seen.finish_reason = piece.finish_reason or seen.finish_reason
            seen.prompt_tokens, seen.completion_tokens = piece.prompt_tokens, piece.completion_tokens
    return list(merged.values())


async def stream(engine, seqs: list[Sequence]) -> AsyncIterator[Piece]:
    """Every sequence's pieces as they arrive (empty non-final pieces dropped; pieces of one sequence
    that queued up together are joined into one); the first error raises."""
    queue: asyncio.Queue = asyncio.Queue()

    async def run(seq: Sequence) -> None:
        tracker = _Tracker(seq.index, seq.max_tokens)
        try:
            async for response in engine.stream_infer(STREAM_MODEL, seq.inputs):
                piece = tracker.piece(response)
                if piece is not None:
                    queue.put_nowait(piece)
        except BadRequest as exc:  # the model refused this prompt: say which one, when there are several
            queue.put_nowait(exc if seq.where == "prompt" else
                             BadRequest(f"{seq.where}: {exc.message}", param="prompt", code=exc.code))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which fails the request
            queue.put_nowait(exc)
        finally:
            queue.put_nowait(_DONE)

    tasks = [asyncio.create_task(run(seq)) for seq in seqs]
    try:
        remaining = len(tasks)
        while remaining:
            items = [await queue.get()]
            while not queue.empty():  # pieces that queued up while the client was written to
                items.append(queue.get_nowait())
            remaining -= sum(item is _DONE for item in items)
            errors = [i for i, item in enumerate(items) if isinstance(item, Exception)]
            for piece in _coalesced([item for item in items[:errors[0] if errors else None] if isinstance(item, Piece)]):
                yield piece
            if errors:
                raise items[errors[0]]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def collect(engine, seqs: list[Sequence]) -> list[Choice]:
    """Whole choices in index order."""
    by_index = {s.index: Choice(s.index, s.prompt_index, "", "", 0, 0) for s in seqs}
    async for piece in stream(engine, seqs):
        choice = by_index[piece.index]
        choice.logprobs = joined(choice.logprobs, piece.logprobs, len(choice.text))
        choice.text += piece.text
        choice.prompt_tokens, choice.completion_tokens = piece.prompt_tokens, piece.completion_tokens
        choice.finish_reason = piece.finish_reason or choice.finish_reason
    return [by_index[i] for i in sorted(by_index)]
