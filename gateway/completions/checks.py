"""Every check made on a POST /v1/completions body (gateway/schemas/completions.py) before any work is
done: the model, parameters it cannot honour (refused by name, never silently dropped), then the values;
what passes is the request's ResolvedCompletion (resolve), every default applied here and nowhere else."""
from __future__ import annotations

import math
import secrets

from gateway.completions.resolved import ResolvedCompletion
from gateway.errors import BadRequest, NotFound
from gateway.schemas.completions import CompletionRequest
from gateway.schemas.text_input import input_form
from gateway.settings import Settings

MAX_LOGPROBS = 5  # as OpenAI (the engines give up to codegen_common.limits.MAX_LOGPROBS alternatives)
MAX_SEED = 2**63 - 1
# OpenAI's defaults that the schema leaves as null (the rest are the schema's field defaults: _given)
DEFAULT_TEMPERATURE = DEFAULT_TOP_P = 1.0


def _bad(message: str, param: str, code: str = "invalid_value") -> BadRequest:
    return BadRequest(message, param=param, code=code)


MAX_TOKEN_ID = 2**31 - 1  # ids travel as INT32; the model checks each against its own vocabulary


def _token_ids(value, where: str, settings: Settings) -> tuple[int, ...]:
    """A token-id prompt (the schema leaves it unvalidated): ints that fit the INT32 tensor, at most as many as
    the prompt's bytes may be (every token spells at least one byte). The model names an id past its vocabulary."""
    if not isinstance(value, list):
        raise _bad(f"{where} must be a list of token ids (integers), like every prompt of a token-id request",
                   "prompt")
    if not value:
        raise _bad(f"{where} is empty: send token ids to continue", "prompt")
    if len(value) > settings.max_text_bytes:
        raise _bad(f"{where} has {len(value)} token ids, over the limit of {settings.max_text_bytes} "
                   "(MAX_TEXT_BYTES: every token is at least one byte)", "prompt")
    if all(type(token) is int for token in value) and 0 <= min(value) and max(value) <= MAX_TOKEN_ID:
        return tuple(value)  # the common case, in builtins: a body of millions of ids stays cheap
    for position, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token <= MAX_TOKEN_ID:
            raise _bad(f"{where}[{position}] is {token!r}: not a token id (an integer from 0 to the vocabulary's "
                       "last id)", "prompt", "invalid_token_id")
    return tuple(value)


def prompts_of(body: CompletionRequest, settings: Settings) -> list[str | tuple[int, ...]]:
    """Each prompt: a text, or the model's own token ids (an array of ints, or an array of such arrays, as
    OpenAI's API defines them), which go to the model as they are."""
    if body.prompt is None:
        raise _bad("you must provide a prompt", "prompt", "missing_required_parameter")
    form = input_form(body.prompt)
    if form == "tokens":
        return [_token_ids(body.prompt, "prompt", settings)]
    if form == "token_arrays":
        return [_token_ids(ids, f"prompt[{i}]", settings) for i, ids in enumerate(body.prompt)]
    prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
    if not prompts:
        raise _bad("prompt is an empty list: send at least one prompt", "prompt")
    for i, prompt in enumerate(prompts):
        where = "prompt" if isinstance(body.prompt, str) else f"prompt[{i}]"
        if not prompt:
            raise _bad(f"{where} is empty: send text to continue", "prompt")
        size = len(prompt.encode("utf-8"))
        if size > settings.max_text_bytes:
            raise _bad(f"{where} is {size} bytes, over the limit of {settings.max_text_bytes} (MAX_TEXT_BYTES)",
                       "prompt")
    return prompts


def stop_words_of(body: CompletionRequest) -> tuple[str, ...]:
    """Bounded by the schema already (MAX_STOP strings of MAX_STOP_CHARS), before anything copies them."""
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return tuple(s for s in stop if s)  # an empty stop string stops nothing


# OpenAI parameters this model cannot honour, each with the value that does nothing (accepted, as clients
# send their defaults explicitly: logprobs=0, suffix="", penalties of 0) and why any other value is refused
NO_OPS: dict[str, tuple[str, str]] = {
    "suffix": ('null or ""', "the model completes after the prompt only (no insertion)"),
    "logit_bias": ("null, {} or biases of 0", "the generator takes no token biases"),
    "best_of": ("null or equal to n", "the generator returns every sequence it samples (use n)"),
    "presence_penalty": ("null or 0", "the generator applies no penalties"),
    "frequency_penalty": ("null or 0", "the generator applies no penalties"),
}


def _is_no_op(name: str, value, n: int) -> bool:
    if value is None:
        return True
    if name == "logit_bias":
        return all(bias == 0 for bias in value.values())
    if name == "best_of":
        return value == n
    return value in (0, "")  # suffix "", penalties 0 (0.0 == 0)


def check_unsupported(body: CompletionRequest, n: int) -> None:
    for name, (no_op, why) in NO_OPS.items():
        if not _is_no_op(name, getattr(body, name), n):
            raise _bad(f"{name} is not supported by this model ({why}): leave it out or send {no_op}", name,
                       "unsupported_parameter")


def _given(body: CompletionRequest, name: str):
    """The field's value; null (what clients send for "not set") reads as the schema's default, so each
    default is stated once, in the schema, where the OpenAPI document shows it."""
    value = getattr(body, name)
    return type(body).model_fields[name].default if value is None else value


def resolve(body: CompletionRequest, settings: Settings) -> ResolvedCompletion:
    """Every bound, in the order a client reads errors: the model, unsupported parameters, then values.
    The prompt's length against the context window is checked by the model's preprocessing (it owns the
    tokenizer); its INVALID_ARGUMENT message names the limit."""
    if body.model != settings.completions_model:
        raise NotFound(f"the model '{body.model}' does not exist: completions are served by "
                       f"'{settings.completions_model}'", param="model", code="model_not_found")
    n = _given(body, "n")
    check_unsupported(body, n or 1)  # best_of equal to n; an n of 0 is refused below, by name
    prompts = prompts_of(body, settings)
    if body.logprobs is not None and not 0 <= body.logprobs <= MAX_LOGPROBS:
        raise _bad(f"logprobs must be between 0 and {MAX_LOGPROBS}, got {body.logprobs}", "logprobs")
    max_tokens, echo = _given(body, "max_tokens"), bool(body.echo)
    scoring = echo and body.logprobs is not None  # max_tokens 0: score the prompt only
    if not (0 if scoring else 1) <= max_tokens <= settings.completions_max_tokens:
        raise _bad(f"max_tokens must be between 1 and {settings.completions_max_tokens} "
                   f"(COMPLETIONS_MAX_TOKENS), got {max_tokens} (0 only with echo and logprobs: score the prompt)",
                   "max_tokens")
    if body.temperature is not None and not (math.isfinite(body.temperature) and 0 <= body.temperature <= 2):
        raise _bad(f"temperature must be between 0 and 2, got {body.temperature}", "temperature")
    if body.top_p is not None and not (math.isfinite(body.top_p) and 0 < body.top_p <= 1):
        raise _bad(f"top_p must be in (0, 1], got {body.top_p}", "top_p")
    if body.seed is not None and not 0 <= body.seed <= MAX_SEED:
        raise _bad(f"seed must be between 0 and {MAX_SEED}, got {body.seed}", "seed")
    if not 1 <= n <= settings.completions_max_n:
        raise _bad(f"n must be between 1 and {settings.completions_max_n} (COMPLETIONS_MAX_N), got {n}", "n")
    if len(prompts) * n > settings.completions_max_sequences:
        raise _bad(f"{len(prompts)} prompts x n={n} is {len(prompts) * n} sequences, over the limit of "
                   f"{settings.completions_max_sequences} (COMPLETIONS_MAX_SEQUENCES)", "prompt")
    stop = stop_words_of(body)
    stream = bool(body.stream)
    if body.stream_options is not None and not stream:
        raise _bad("stream_options is only allowed when stream is true", "stream_options")
    return ResolvedCompletion(
        model=body.model, prompts=tuple(prompts), n=n, max_tokens=max_tokens,
        temperature=DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
        top_p=DEFAULT_TOP_P if body.top_p is None else body.top_p,
        seed=secrets.randbits(62) if body.seed is None else body.seed,
        stop=stop, echo=echo, logprobs=body.logprobs, token_healing=body.token_healing, stream=stream,
        include_usage=body.stream_options is not None and body.stream_options.include_usage)
