"""The body of POST /v1/completions (OpenAI's legacy completions). Unknown fields are ignored (as the
gateway's other endpoints do); parameters the model cannot honour are refused by name, never silently
dropped (gateway/completions/checks.py). A field's default here is also what its null means: checks.resolve
reads it from this model, so each default is written once and the OpenAPI document shows it."""
from __future__ import annotations

from typing import Annotated, Union

from pydantic import BaseModel, Field, StrictInt, StringConstraints, field_validator
from pydantic_core import PydanticCustomError

from codegen_common.limits import DEFAULT_MAX_TOKENS  # the generator's default too: one definition
from gateway.schemas.text_input import TextInput

MAX_STOP, MAX_STOP_CHARS = 4, 64  # OpenAI's bounds on stop strings, refused here before any copy (issue 56)
StopWord = Annotated[str, StringConstraints(max_length=MAX_STOP_CHARS)]  # the bounds in the OpenAPI document;
StopWords = Annotated[list[StopWord], Field(max_length=MAX_STOP)]  # CompletionRequest._bounded_stop refuses


class StreamOptions(BaseModel):
    include_usage: bool = False


class CompletionRequest(BaseModel):
    model: str
    # a string, a list of strings, the model's own token ids or a list of such arrays (checked in
    # gateway/completions/checks.py; the model checks each id against its vocabulary)
    prompt: Union[TextInput, None] = None
    # strict: the token quota charges max_tokens x n, so "512" or 512.0 is a 400, never a cheaper guess (issue 56)
    max_tokens: StrictInt | None = DEFAULT_MAX_TOKENS
    temperature: float | None = None  # OpenAI's default: 1
    top_p: float | None = None  # OpenAI's default: 1
    seed: int | None = None
    stop: Union[StopWord, StopWords, None] = None
    n: StrictInt | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    echo: bool | None = False
    user: str | None = None
    logprobs: int | None = None  # 0-5: each token's logprob and that many alternatives (with echo: the prompt's too)
    token_healing: bool | None = None  # not OpenAI's: null/true heals a prompt ending mid-token (docs/clients.md)
    # accepted by OpenAI, not by this model: refused when set to anything but their no-op value
    best_of: int | None = None
    suffix: str | None = None
    logit_bias: dict | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _bounded_stop(cls, stop):
        """Every stop string is copied into every sequence's tensors: bounded before that, on the parsed
        JSON before pydantic copies a list (Triton's own stop-word limit is 64 characters too)."""
        words = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
        if len(words) > MAX_STOP:
            raise PydanticCustomError("too_long", f"stop takes at most {MAX_STOP} strings, got {len(words)}")
        for i, word in enumerate(words):
            if isinstance(word, str) and len(word) > MAX_STOP_CHARS:
                where = "stop" if isinstance(stop, str) else f"stop[{i}]"
                raise PydanticCustomError("string_too_long", f"{where} is {len(word)} characters, over the "
                                                             f"limit of {MAX_STOP_CHARS}")
        return stop
