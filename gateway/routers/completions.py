"""POST /v1/completions (OpenAI's legacy completions) for codegen: check, run the sequences on
`codegen_stream`, answer as one JSON body or as server-sent events. A client that leaves (closed
connection, abandoned stream) cancels its sequences, so they leave the generator's batch."""
from __future__ import annotations

import asyncio
from typing import Awaitable, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from gateway import errors
from gateway.completions import sequences as runner
from gateway.completions import shapes
from gateway.completions.checks import check
from gateway.completions.tensors import sequences
from gateway.dependencies import EngineDep, SettingsDep
from gateway.middleware.strict_json import StrictJSONRoute
from gateway.schemas.completions import CompletionRequest
from gateway.telemetry import spans

router = APIRouter(tags=["openai"], route_class=StrictJSONRoute)
T = TypeVar("T")
CLIENT_GONE = 499  # nginx's "client closed request": logged, never received by anyone


class ClientGone(Exception):
    pass


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`, cancelled as soon as the client's connection closes. The body is read by now, so the next
    ASGI message is `http.disconnect`: wait for it beside the work. (Not `request.is_disconnected()`:
    its zero-timeout receive loses the message under an `@app.middleware("http")` middleware.)"""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(request.receive())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        if watch.result().get("type") == "http.disconnect":
            raise ClientGone()
        return await task  # not a disconnect (nothing else is expected): just finish the work
    finally:
        for pending in (task, watch):
            if not pending.done():
                pending.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)


@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request, engine: EngineDep, settings: SettingsDep):
    prompts = check(body, settings)
    seqs = sequences(body, prompts)
    header = shapes.Header(body.model)
    try:
        if body.stream:
            return await _streamed(request, body, seqs, engine, header)
        choices = await until_disconnected(request, runner.collect(engine, seqs))
    except ClientGone:
        return Response(status_code=CLIENT_GONE)
    prompt_tokens = {c.prompt_index: c.prompt_tokens for c in choices}
    # echo: the model prepends the prompt (exclude_input_in_output false), with its tokens' logprobs when asked
    return shapes.response(
        header, [shapes.choice(c.index, c.text, c.finish_reason, c.logprobs) for c in choices],
        shapes.total_usage(prompt_tokens, [c.completion_tokens for c in choices]))


async def _streamed(request: Request, body: CompletionRequest, seqs, engine, header) -> StreamingResponse:
    pieces = runner.stream(engine, seqs)
    # Hold the 200 until every sequence has its first piece (or an error): errors the model finds in a
    # request (a prompt over the context window) are then still a plain 400. The sequences start
    # together and share decode steps, so this is the first piece's time, not the slowest one's.
    first: list[runner.Piece] = []
    try:
        while len({p.index for p in first}) < len(seqs):
            first.append(await until_disconnected(request, pieces.__anext__()))
    except BaseException:
        await pieces.aclose()
        raise
    spans.event("first_token")  # on the request's span, which ends with the stream's last event
    prompt_of = {s.index: s for s in seqs}

    async def events():
        prompt_tokens: dict[int, int] = {}
        completion_tokens: dict[int, int] = {}
        sent: dict[int, int] = {}  # characters of each choice's text already sent (for logprobs' text_offset)
        try:
            async def all_pieces():
                for piece in first:
                    yield piece
                async for piece in pieces:
                    yield piece

            async for piece in all_pieces():
                seq = prompt_of[piece.index]
                prompt_tokens[seq.prompt_index] = piece.prompt_tokens
                completion_tokens[piece.index] = piece.completion_tokens
                before = sent.get(piece.index, 0)
                sent[piece.index] = before + len(piece.text)
                yield shapes.sse(shapes.chunk(header, piece.index, piece.text, piece.finish_reason,
                                              shapes.shifted(piece.logprobs, before)))
            if body.stream_options is not None and body.stream_options.include_usage:
                yield shapes.sse(shapes.usage_chunk(
                    header, shapes.total_usage(prompt_tokens, list(completion_tokens.values()))))
            yield shapes.DONE
        except errors.ApiError as exc:  # the 200 is gone: the error travels as an event
            yield shapes.sse(exc.body())
        except Exception as exc:  # noqa: BLE001 - logged with an id, the client sees the id only
            yield shapes.sse(errors.internal(exc, "POST /v1/completions (stream)").body())
        finally:
            await pieces.aclose()

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
