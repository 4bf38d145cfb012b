"""Rows of text -> the padded tensors the ner tagger and decoder read."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ner_preprocess.char_encoding import CharLMEncoding
from ner_preprocess.flair_sentence import tokenize
from stage_common.errors import BadInput

DIRECTIONS = ("forward", "backward")  # the order of the 2-sized axis of char_ids / char_count / token_positions


def check_lengths(texts: list[str], max_text_length: int) -> list[str]:
    for i, text in enumerate(texts):
        if len(text) > max_text_length:
            raise BadInput(f"'text' row {i} has {len(text)} characters, over the limit of "
                           f"{max_text_length} (model parameter max_text_length)")
    return texts


class NerPreprocessor:
    def __init__(self, char_lm_file: Path):
        settings = json.loads(Path(char_lm_file).read_text())
        self.lms = [CharLMEncoding(settings[d], forward=(d == "forward")) for d in DIRECTIONS]

    def encode(self, texts: list[str]) -> dict[str, np.ndarray]:
        """One request's rows, padded to its longest row (at least 1 token slot, so no tensor is empty)."""
        sentences = [tokenize(t) for t in texts]
        encoded = [[lm.encode(tokens) for lm in self.lms] for tokens in sentences]
        rows = len(texts)
        max_chars = max(len(ids) for row in encoded for ids, _ in row)
        max_tokens = max([1] + [len(tokens) for tokens in sentences])
        char_ids = np.empty((rows, len(self.lms), max_chars), dtype=np.int64)
        char_count = np.zeros((rows, len(self.lms)), dtype=np.int64)
        positions = np.zeros((rows, len(self.lms), max_tokens), dtype=np.int64)
        offsets = np.zeros((rows, max_tokens, 2), dtype=np.int64)
        for r, (tokens, row) in enumerate(zip(sentences, encoded)):
            for d, (lm, (ids, pos)) in enumerate(zip(self.lms, row)):
                char_ids[r, d, :] = lm.padding_id
                char_ids[r, d, : len(ids)] = ids
                char_count[r, d] = len(ids)
                positions[r, d, : len(pos)] = pos
            if tokens:
                offsets[r, : len(tokens)] = [(t.start, t.end) for t in tokens]
        token_count = np.array([[len(tokens)] for tokens in sentences], dtype=np.int64).reshape(rows, 1)
        return {"char_ids": char_ids, "char_count": char_count, "token_positions": positions,
                "token_count": token_count, "token_offsets": offsets}

    def encode_per_request(self, requests: list[list[str]]) -> list[dict[str, np.ndarray] | Exception]:
        results: list = []
        for texts in requests:  # a failure stays with its own request
            try:
                results.append(self.encode(texts))
            except Exception as exc:  # noqa: BLE001
                results.append(exc)
        return results
