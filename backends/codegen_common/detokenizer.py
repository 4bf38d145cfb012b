"""Generated ids -> text (no torch), cut before the first stop word."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from tokenizers import Tokenizer


def cut_at_stop_words(text: str, stop_words: Sequence[str]) -> str:
    found = [i for i in (text.find(w) for w in stop_words if w) if i >= 0]
    return text[:min(found)] if found else text


class Detokenizer:
    def __init__(self, tokenizer_file: Path):
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))

    def decode(self, requests: list[tuple[np.ndarray, list[str]]]) -> list[str | Exception]:
        """One text per (ids, stop_words). The ids are the continuation only (never the prompt) and
        end on a character boundary (the generator releases them so), so streamed chunks decode to
        pieces that concatenate to the whole."""
        ids = [ids.tolist() for ids, _ in requests]
        try:
            texts = self.tokenizer.decode_batch(ids, skip_special_tokens=True)
        except Exception:  # noqa: BLE001 - find the row that fails: it alone gets the error
            texts = [self._decode_one(row) for row in ids]
        return [text if isinstance(text, Exception) else cut_at_stop_words(text, stop)
                for text, (_, stop) in zip(texts, requests)]

    def _decode_one(self, ids: list[int]) -> str | Exception:
        try:
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        except Exception as exc:  # noqa: BLE001
            return exc
