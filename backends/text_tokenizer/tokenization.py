"""A Hugging Face fast tokenizer (tokenizer.json) driven the way sentence-transformers drives it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer


class TextTokenizer:
    def __init__(self, tokenizer_file: Path, max_length: int):
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self.tokenizer.no_padding()  # tokenizer.json may carry fixed padding; we pad per request
        self.tokenizer.enable_truncation(max_length=max_length)
        pad = self.tokenizer.token_to_id("[PAD]")
        self.pad_id = 0 if pad is None else pad

    def _pad(self, encodings: list[Encoding]) -> tuple[np.ndarray, np.ndarray]:
        longest = max((len(e.ids) for e in encodings), default=0)
        ids = np.full((len(encodings), longest), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(encodings), longest), dtype=np.int64)
        for row, enc in enumerate(encodings):
            ids[row, : len(enc.ids)] = enc.ids
            mask[row, : len(enc.ids)] = 1
        return ids, mask

    def encode_per_request(self, requests: list[list[str]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """input_ids and attention_mask per request, right-padded to that request's longest row.
        One tokenizer call covers every row; texts are stripped first, as sentence-transformers does."""
        encodings = self.tokenizer.encode_batch([t.strip() for texts in requests for t in texts])
        out, start = [], 0
        for texts in requests:
            out.append(self._pad(encodings[start:start + len(texts)]))
            start += len(texts)
        return out

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return self.encode_per_request([texts])[0]
