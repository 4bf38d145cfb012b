"""Every check made on a POST /v1/completions body (gateway/schemas/completions.py) before any work is
done: the model, parameters it cannot honour (refused by name, never silently dropped), then the values."""
from __future__ import annotations

import math

from gateway.errors import BadRequest, NotFound
from gateway.schemas.completions import DEFAULT_MAX_TOKENS, CompletionRequest
from gateway.schemas.text_input import input_form
from gateway.settings import Settings

MAX_STOP = 4  # as OpenAI
MAX_LOGPROBS = 5  # as OpenAI
MAX_SEED = 2**63 - 1


def _bad(message: str, param: str, code: str = "invalid_value") -> BadRequest:
    return BadRequest(message, param=param, code=code)


def prompts_of(body: CompletionRequest, settings: Settings) -> list[str]:
    if body.prompt is None:
        raise _bad("you must provide a prompt", "prompt", "missing_required_parameter")
    if input_form(body.prompt) in ("tokens", "token_arrays"):
        raise _bad("prompt holds token ids: this model takes text only (ids made by another tokenizer would be "
                   "other text here); send the prompt as a string", "prompt", "token_ids_not_supported")
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


def stop_words_of(body: CompletionRequest) -> list[str]:
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(stop) > MAX_STOP:
        raise _bad(f"stop takes at most {MAX_STOP} strings, got {len(stop)}", "stop")
    return [s for s in stop if s]  # an empty stop string stops nothing


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


def check_unsupported(body: CompletionRequest) -> None:
    n = body.n or 1
    for name, (no_op, why) in NO_OPS.items():
        if not _is_no_op(name, getattr(body, name), n):
            raise _bad(f"{name} is not supported by this model ({why}): leave it out or send {no_op}", name,
                       "unsupported_parameter")


def check(body: CompletionRequest, settings: Settings) -> list[str]:
    """Every bound, in the order a client reads errors: the model, unsupported parameters, then values.
    Returns the prompts. The prompt's length against the context window is checked by the model's
    preprocessing (it owns the tokenizer); its INVALID_ARGUMENT message names the limit."""
    if body.model != settings.completions_model:
        raise NotFound(f"the model '{body.model}' does not exist: completions are served by "
                       f"'{settings.completions_model}'", param="model", code="model_not_found")
    check_unsupported(body)
    prompts = prompts_of(body, settings)
    if body.logprobs is not None and not 0 <= body.logprobs <= MAX_LOGPROBS:
        raise _bad(f"logprobs must be between 0 and {MAX_LOGPROBS}, got {body.logprobs}", "logprobs")
    max_tokens = DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    scoring = bool(body.echo) and body.logprobs is not None  # max_tokens 0: score the prompt only
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
    n = 1 if body.n is None else body.n
    if not 1 <= n <= settings.completions_max_n:
        raise _bad(f"n must be between 1 and {settings.completions_max_n} (COMPLETIONS_MAX_N), got {n}", "n")
    if len(prompts) * n > settings.completions_max_sequences:
        raise _bad(f"{len(prompts)} prompts x n={n} is {len(prompts) * n} sequences, over the limit of "
                   f"{settings.completions_max_sequences} (COMPLETIONS_MAX_SEQUENCES)", "prompt")
    stop_words_of(body)
    if body.stream_options is not None and not body.stream:
        raise _bad("stream_options is only allowed when stream is true", "stream_options")
    return prompts
