"""Inputs against the model's maximum sequence length: OpenAI answers 400 for an input over the model's
context, and text-embeddings-inference refuses one unless the request says `truncate`. An input that the
model would cut is refused, naming its index and the limit, unless the request (or TRUNCATE_DEFAULT)
asks for truncation; `usage` counts the tokens the model sees."""
from __future__ import annotations

from gateway.errors import BadRequest


def tokens_seen(lengths: list[int], max_tokens: int, truncate: bool, what: str = "input") -> int:
    """Tokens the model embeds for inputs of `lengths` tokens; 400 for the first one over `max_tokens`
    unless `truncate`."""
    if not truncate:
        for i, length in enumerate(lengths):
            if length > max_tokens:
                raise BadRequest(
                    f"{what}[{i}] is {length} tokens, over this model's maximum sequence length of {max_tokens} "
                    f"tokens: shorten it, or send \"truncate\": true to embed its first {max_tokens} tokens",
                    param=what, code="context_length_exceeded")
    return sum(min(length, max_tokens) for length in lengths)
