"""A resolved completion request as codegen sequences: one per (prompt, choice), each the codegen tensors
of one row (tensor contract of `codegen` / `codegen_stream`). Choice j of every prompt is seeded seed + j,
so a list of prompts samples as the same prompts sent one by one, and a seeded request is reproducible."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gateway.completions.resolved import ResolvedCompletion

STREAM_MODEL = "codegen_stream"  # decoupled and cancellable: serves unary and streamed completions


@dataclass(frozen=True)
class Sequence:
    index: int  # the choice's index in the response: prompt_index * n + j
    prompt_index: int
    prompt: str | tuple[int, ...]  # a text, or token ids
    max_tokens: int  # what inputs["max_tokens"] says, kept here so that nothing reads it back out of the tensor
    inputs: dict[str, np.ndarray]
    where: str = "prompt"  # how errors name its prompt: prompt[i] when the request has several


def _one(value, dtype) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


def prompt_inputs(prompt: str | tuple[int, ...]) -> dict[str, np.ndarray]:
    """text_input for a text; input_ids for token ids, which the model takes as they are (no tokenizer, no
    healing: codegen_stream's contract)."""
    if isinstance(prompt, str):
        return {"text_input": _one(prompt, np.object_)}
    return {"input_ids": np.array([prompt], dtype=np.int32)}


def sequence_inputs(prompt: str | tuple[int, ...], max_tokens: int, temperature: float, top_p: float, seed: int,
                    stop_words: list[str] | tuple[str, ...], echo: bool = False, logprobs: int | None = None,
                    token_healing: bool | None = None) -> dict[str, np.ndarray]:
    inputs = {**prompt_inputs(prompt), "max_tokens": _one(max_tokens, np.int32),
              "temperature": _one(temperature, np.float32), "top_k": _one(0, np.int32),  # 0: no top-k (OpenAI has none)
              "top_p": _one(top_p, np.float32), "random_seed": _one(seed, np.uint64)}
    if stop_words:
        inputs["stop_words"] = np.array([list(stop_words)], dtype=np.object_)
    if echo:  # the model prepends the prompt (and, with logprobs, gives the prompt's tokens' logprobs)
        inputs["exclude_input_in_output"] = _one(False, bool)
    if logprobs is not None:
        inputs["logprobs"] = _one(logprobs, np.int32)
    if token_healing is not None:
        inputs["token_healing"] = _one(token_healing, bool)
    return inputs


def sequences(completion: ResolvedCompletion) -> list[Sequence]:
    c, n = completion, completion.n
    return [Sequence(p * n + j, p, prompt, c.max_tokens,
                     sequence_inputs(prompt, c.max_tokens, c.temperature, c.top_p, c.seed + j, c.stop, c.echo,
                                     c.logprobs, c.token_healing),
                     "prompt" if len(c.prompts) == 1 else f"prompt[{p}]")
            for p, prompt in enumerate(c.prompts) for j in range(n)]
