"""POST /v1/completions (OpenAI's legacy completions) for codegen: check, run the sequences on
`codegen_stream`, answer as one JSON body or as server-sent events. A client that leaves (closed
connection, abandoned stream) cancels its sequences, so they leave the generator's batch."""
from __future__ import annotations

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from gateway import errors
from gateway.completions import sequences as runner
from gateway.completions import shapes
from gateway.completions.checks import resolve
from gateway.completions.resolved import ResolvedCompletion
from gateway.completions.tensors import sequences
from gateway.client_gone import CLIENT_GONE, ClientGone, until_disconnected
from gateway.dependencies import EngineDep, QuotasDep, SettingsDep
from gateway.middleware.body_limits import owner_of
from gateway.middleware.strict_json import StrictJSONRoute
from gateway.schemas.completions import CompletionRequest
from gateway.telemetry import spans
from gateway.triton.fair_slots import SlotEngine, completion_slots

router = APIRouter(tags=["openai"], route_class=StrictJSONRoute)
@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request, engine: EngineDep, settings: SettingsDep,
                            quotas: QuotasDep):
    completion = resolve(body, settings)  # read once: the quota, the tensors and the answer use this alone
    if quotas is not None:  # the key's tokens per minute, before any work
        await quotas.charge_tokens(request, completion.budget)
    seqs = sequences(completion)
    # each sequence holds a completion slot while it runs; more wait their owner's turn (gateway/triton/fair_slots.py)
    engine = SlotEngine(engine, completion_slots(request.app.state), owner_of(request.scope))
    header = shapes.Header(completion.model)
    try:
        if completion.stream:
            return await _streamed(request, completion, seqs, engine, header, quotas)
        choices = await until_disconnected(request, runner.collect(engine, seqs))
    except ClientGone:
        return Response(status_code=CLIENT_GONE)
    prompt_tokens = {c.prompt_index: c.prompt_tokens for c in choices}
    await _charge_echo(quotas, request, completion, prompt_tokens)
    # echo: the model prepends the prompt (exclude_input_in_output false), with its tokens' logprobs when asked
    body = shapes.response(
        header, [shapes.choice(c.index, c.text, c.finish_reason, c.logprobs) for c in choices],
        shapes.total_usage(prompt_tokens, [c.completion_tokens for c in choices]))
    # encoded off the event loop: a score-only answer runs to megabytes (issue 56)
    return Response(await anyio.to_thread.run_sync(shapes.rendered, body), media_type="application/json")


async def _charge_echo(quotas, request: Request, completion: ResolvedCompletion, prompt_tokens: dict[int, int]):
    """With echo every choice sends its prompt's tokens back (a score-only request sends nothing else):
    charged once the model has counted them, before any of the answer leaves (issue 56)."""
    if quotas is not None and completion.echo:
        await quotas.charge_echo(request, completion.n * sum(prompt_tokens.values()))


async def _streamed(request: Request, completion: ResolvedCompletion, seqs, engine, header,
                    quotas=None) -> StreamingResponse:
    pieces = runner.stream(engine, seqs)
    # Hold the 200 until every sequence has its first piece (or an error): errors the model finds in a
    # request (a prompt over the context window) are then still a plain 400. The sequences start
    # together and share decode steps, so this is the first piece's time, not the slowest one's.
    first: list[runner.Piece] = []
    try:
        while len({p.index for p in first}) < len(seqs):
            first.append(await until_disconnected(request, pieces.__anext__()))
        prompt_of_choice = {s.index: s.prompt_index for s in seqs}
        await _charge_echo(quotas, request, completion, {prompt_of_choice[p.index]: p.prompt_tokens for p in first})
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
            if completion.include_usage:
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
