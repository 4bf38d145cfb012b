"""A completion request's parameters, resolved once: every default applied and every value checked
(checks.resolve builds it from the parsed body). The token quota, the codegen tensors, the sequences' runs
and the answer all read this object; nothing reads the body, or a tensor built from it, again."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ResolvedCompletion:
    model: str
    prompts: tuple[str | tuple[int, ...], ...]  # a text, or the model's own token ids (sent as they are)
    n: int  # choices per prompt
    max_tokens: int  # 0: score the prompt only (echo with logprobs)
    temperature: float
    top_p: float
    seed: int  # choice j of every prompt is seeded seed + j; drawn at random when the request gives none
    stop: tuple[str, ...]  # without empty strings (they stop nothing)
    echo: bool
    logprobs: int | None  # None: none asked
    token_healing: bool | None  # None: the model's default (the tensor is not sent)
    stream: bool
    include_usage: bool  # streamed: a last chunk with the usage

    @property
    def budget(self) -> int:
        """Tokens the request may generate, charged against the key's tokens per minute before it runs (as
        OpenAI counts): max_tokens x n x prompts; a score-only sequence (max_tokens 0) counts 1."""
        return max(self.max_tokens, 1) * self.n * len(self.prompts)
