"""Token counts of embedding inputs, with the model's own tokenizer.json (cached per file), counted before
truncation: the model's maximum sequence length is checked against them (gateway/embedding/lengths.py)
and `usage` is what the model sees after truncating to it."""
from __future__ import annotations

from functools import lru_cache

from tokenizers import Tokenizer

from gateway.modelgen import ModelSpec
from gateway.telemetry import spans


@lru_cache(maxsize=16)
def _tokenizer(path: str) -> Tokenizer:
    tokenizer = Tokenizer.from_file(path)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def token_lengths(spec: ModelSpec, texts: list[str]) -> list[int] | None:
    """Tokens of each text as the model's stages make them (stripped, special tokens included), before
    truncation; None when the model has no tokenizer.json to count with."""
    if not spec.tokenizer_file:
        return None
    with spans.stage("gateway.count_tokens", {"gateway.texts": len(texts)}):  # a traced request's child span
        return [len(e.ids) for e in _tokenizer(spec.tokenizer_file).encode_batch([t.strip() for t in texts])]
