"""Token counts for `usage`, with the model's own tokenizer.json and truncation (cached per file)."""
from __future__ import annotations

from functools import lru_cache

from tokenizers import Tokenizer

from gateway.modelgen import ModelSpec


@lru_cache(maxsize=16)
def _tokenizer(path: str, max_tokens: int) -> Tokenizer:
    tokenizer = Tokenizer.from_file(path)
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_tokens)
    return tokenizer


def count_tokens(spec: ModelSpec, texts: list[str]) -> int:
    """Tokens the model sees for `texts` (special tokens included, after truncation), as the stages do."""
    if not spec.tokenizer_file:
        return 0
    return sum(len(e.ids) for e in _tokenizer(spec.tokenizer_file, spec.max_tokens).encode_batch([t.strip() for t in texts]))
