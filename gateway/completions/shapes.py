"""OpenAI's completion shapes: the unary response, stream chunks, the usage chunk, and SSE framing."""
from __future__ import annotations

import json
import time
import uuid

import orjson

DONE = b"data: [DONE]\n\n"


class Header:
    """id, created and model: the same on a response and on every chunk of its stream."""

    def __init__(self, model: str):
        self.id, self.created, self.model = f"cmpl-{uuid.uuid4().hex}", int(time.time()), model

    def base(self) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model}


def choice(index: int, text: str, finish_reason: str | None, logprobs: dict | None = None) -> dict:
    return {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": logprobs}


LOGPROBS_KEYS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


def shifted(logprobs: dict | None, by: int) -> dict | None:
    """A piece's logprobs object with text_offset counted from `by` characters earlier (the choice's text
    before the piece): the model counts from the start of each piece."""
    if logprobs is None or not by:
        return logprobs
    return {**logprobs, "text_offset": [offset + by for offset in logprobs["text_offset"]]}


def joined(first: dict | None, then: dict | None, first_text_length: int) -> dict | None:
    """Two consecutive pieces' logprobs objects as one (the second piece starts after first_text_length).
    `first` is the caller's accumulator (what an earlier call returned, or a piece's own object that nothing
    else reads) and is extended in place: a choice of k pieces costs the total of their lengths, where a new
    object per piece copied everything before it again, quadratic (issue 56)."""
    if then is None:
        return first
    then = shifted(then, first_text_length)
    if first is None:
        return {key: list(then[key]) for key in LOGPROBS_KEYS}  # a copy: the piece's lists stay the piece's
    for key in LOGPROBS_KEYS:
        first[key].extend(then[key])
    return first


def rendered(body: dict) -> bytes:
    """A unary answer as JSON bytes (orjson: ~10x json's speed on logprobs' nested lists), for a worker
    thread: a score-only answer of 64 long prompts is ~11 MB, which held the event loop for over a second
    when FastAPI encoded it there (issue 56)."""
    return orjson.dumps(body)


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response(header: Header, choices: list[dict], usage_: dict) -> dict:
    return {**header.base(), "choices": choices, "usage": usage_}


def chunk(header: Header, index: int, text: str, finish_reason: str | None, logprobs: dict | None = None) -> dict:
    return {**header.base(), "choices": [choice(index, text, finish_reason, logprobs)]}


def usage_chunk(header: Header, usage_: dict) -> dict:
    return {**header.base(), "choices": [], "usage": usage_}


def sse(data: dict) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"


def total_usage(prompt_tokens_by_prompt: dict[int, int], completion_tokens: list[int]) -> dict:
    """OpenAI counts each prompt once, however many choices (n) it has."""
    return usage(sum(prompt_tokens_by_prompt.values()), sum(completion_tokens))
