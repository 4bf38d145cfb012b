"""A completion request as codegen sequences: one per (prompt, choice), each the codegen tensors of one
row (tensor contract of `codegen` / `codegen_stream`). Choice j of every prompt is seeded seed + j, so a
list of prompts samples as the same prompts sent one by one, and a seeded request is reproducible."""
from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np

from gateway.completions.checks import stop_words_of
from gateway.schemas.completions import DEFAULT_MAX_TOKENS, CompletionRequest

STREAM_MODEL = "codegen_stream"  # decoupled and cancellable: serves unary and streamed completions


@dataclass(frozen=True)
class Sequence:
    index: int  # the choice's index in the response: prompt_index * n + j
    prompt_index: int
    prompt: str
    inputs: dict[str, np.ndarray]


def _one(value, dtype) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


def sequence_inputs(prompt: str, max_tokens: int, temperature: float, top_p: float, seed: int,
                    stop_words: list[str], echo: bool = False, logprobs: int | None = None,
                    token_healing: bool | None = None) -> dict[str, np.ndarray]:
    inputs = {"text_input": _one(prompt, np.object_), "max_tokens": _one(max_tokens, np.int32),
              "temperature": _one(temperature, np.float32), "top_k": _one(0, np.int32),  # 0: no top-k (OpenAI has none)
              "top_p": _one(top_p, np.float32), "random_seed": _one(seed, np.uint64)}
    if stop_words:
        inputs["stop_words"] = np.array([stop_words], dtype=np.object_)
    if echo:  # the model prepends the prompt (and, with logprobs, gives the prompt's tokens' logprobs)
        inputs["exclude_input_in_output"] = _one(False, bool)
    if logprobs is not None:
        inputs["logprobs"] = _one(logprobs, np.int32)
    if token_healing is not None:
        inputs["token_healing"] = _one(token_healing, bool)
    return inputs


def sequences(body: CompletionRequest, prompts: list[str]) -> list[Sequence]:
    n = body.n or 1
    temperature = 1.0 if body.temperature is None else body.temperature
    top_p = 1.0 if body.top_p is None else body.top_p
    max_tokens = DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    base_seed = secrets.randbits(62) if body.seed is None else body.seed
    stop_words = stop_words_of(body)
    return [Sequence(p * n + j, p, prompt,
                     sequence_inputs(prompt, max_tokens, temperature, top_p, base_seed + j, stop_words,
                                     bool(body.echo), body.logprobs, body.token_healing))
            for p, prompt in enumerate(prompts) for j in range(n)]
