"""Rows of text -> the padded tensors the ner tagger and decoder read. Each row is split into sentences
(flair's SegtokSentenceSplitter); the tagger runs every sentence as a row of its own, so a long text costs
many short LM runs side by side instead of one long serial one."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ner_preprocess.char_encoding import CharLMEncoding
from ner_preprocess.sentences import sentence_tokens
from stage_common.errors import BadInput, check_limit

DIRECTIONS = ("forward", "backward")  # the order of the 2-sized axes of char_ids / sentence_chars / token_positions


def check_request_size(texts: list[str], max_request_characters: int) -> list[str]:
    """Checked before any splitting or tokenization: the whole request's characters bound its tagger time."""
    check_limit(sum(len(t) for t in texts), max_request_characters, "the request's text length (characters, "
                "all rows)", "model parameter max_request_characters")
    return texts


class NerPreprocessor:
    def __init__(self, char_lm_file: Path, max_sentence_characters: int = 1_000_000):
        settings = json.loads(Path(char_lm_file).read_text())
        self.lms = [CharLMEncoding(settings[d], forward=(d == "forward")) for d in DIRECTIONS]
        self.max_sentence_characters = max_sentence_characters

    def _sentences(self, row: int, text: str):
        sentences = sentence_tokens(text)
        for k, tokens in enumerate(sentences):
            # a sentence is one serial LM run: its length bounds the request's latency
            check_limit(tokens[-1].end - tokens[0].start, self.max_sentence_characters,
                        f"the length in characters of sentence {k} of 'text' row {row} (at character {tokens[0].start})",
                        "model parameter max_sentence_characters")
        return sentences

    def encode(self, texts: list[str]) -> dict[str, np.ndarray]:
        """One request's rows, padded to its longest row (at least 1 slot per axis, so no tensor is empty).
        Per row: char_ids [2, chars] = its sentences' LM inputs one after the other; sentence_chars
        [sentences, 2] and sentence_tokens [sentences] their sizes; token_positions [2, tokens] where each
        token's embedding is read, counted from its own sentence's start; token_offsets [tokens, 2] into the
        original string; token_count [1] = all tokens of the row."""
        rows = [self._sentences(r, t) for r, t in enumerate(texts)]
        encoded = [[[lm.encode(tokens) for lm in self.lms] for tokens in sentences] for sentences in rows]
        n = len(texts)
        max_chars = max([1] + [sum(len(s[d][0]) for s in row) for row in encoded for d in range(len(self.lms))])
        max_sentences = max([1] + [len(s) for s in rows])
        max_tokens = max([1] + [sum(len(t) for t in s) for s in rows])
        char_ids = np.empty((n, len(self.lms), max_chars), dtype=np.int64)
        for d, lm in enumerate(self.lms):
            char_ids[:, d, :] = lm.padding_id
        sentence_chars = np.zeros((n, max_sentences, len(self.lms)), dtype=np.int64)
        sentence_count = np.zeros((n, max_sentences), dtype=np.int64)
        positions = np.zeros((n, len(self.lms), max_tokens), dtype=np.int64)
        offsets = np.zeros((n, max_tokens, 2), dtype=np.int64)
        token_count = np.zeros((n, 1), dtype=np.int64)
        for r, (sentences, row) in enumerate(zip(rows, encoded)):
            char_at, token_at = [0] * len(self.lms), 0
            for s, (tokens, per_lm) in enumerate(zip(sentences, row)):
                for d, (ids, pos) in enumerate(per_lm):
                    char_ids[r, d, char_at[d]:char_at[d] + len(ids)] = ids
                    sentence_chars[r, s, d] = len(ids)
                    positions[r, d, token_at:token_at + len(pos)] = pos
                    char_at[d] += len(ids)
                sentence_count[r, s] = len(tokens)
                offsets[r, token_at:token_at + len(tokens)] = [(t.start, t.end) for t in tokens]
                token_at += len(tokens)
            token_count[r, 0] = token_at
        return {"char_ids": char_ids, "sentence_chars": sentence_chars, "sentence_tokens": sentence_count,
                "token_positions": positions, "token_count": token_count, "token_offsets": offsets}

    def encode_per_request(self, requests: list[list[str]]) -> list[dict[str, np.ndarray] | Exception]:
        results: list = []
        for texts in requests:  # a failure stays with its own request
            try:
                results.append(self.encode(texts))
            except Exception as exc:  # noqa: BLE001
                results.append(exc)
        return results
