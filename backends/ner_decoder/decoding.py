"""Emission scores of a request's rows -> one JSON entity list per row."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ner_decoder.spans import entities_json, spans_from_bioes
from ner_decoder.viterbi import ViterbiDecoder
from stage_common.errors import BadInput


class NerDecoder:
    def __init__(self, crf_file: Path):
        crf = json.loads(Path(crf_file).read_text())
        self.tags: list[str] = crf["tags"]
        self.viterbi = ViterbiDecoder(np.array(crf["transitions"], dtype=np.float32), crf["start_tag"],
                                      crf["stop_tag"])

    def decode_row(self, text: str, emissions: np.ndarray, offsets: np.ndarray, sentence_tokens: np.ndarray) -> str:
        """Viterbi per sentence (flair's CRF sees one sentence at a time), spans in row token indices."""
        spans, first = [], 0
        for count in (int(n) for n in sentence_tokens if n > 0):
            path, confidences = self.viterbi.decode(emissions[first:first + count])
            spans += [([first + k for k in tokens], score, label) for tokens, score, label in
                      spans_from_bioes([self.tags[i] for i in path], confidences)]
            first += count
        return entities_json(text, offsets, spans)

    def decode(self, texts: list[str], emissions: np.ndarray, offsets: np.ndarray, sentence_tokens: np.ndarray,
               counts: np.ndarray) -> list[str]:
        counts = counts.reshape(-1)
        if not (len(texts) == emissions.shape[0] == offsets.shape[0] == sentence_tokens.shape[0] == len(counts)):
            raise BadInput(f"row counts differ: text {len(texts)}, emissions {emissions.shape[0]}, token_offsets "
                           f"{offsets.shape[0]}, sentence_tokens {sentence_tokens.shape[0]}, token_count {len(counts)}")
        if (sentence_tokens < 0).any() or (sentence_tokens.sum(axis=1) != counts).any():
            raise BadInput("sentence_tokens must be >= 0 and add up to token_count")
        if emissions.shape[-1] != len(self.tags) or min(emissions.shape[1], offsets.shape[1]) < counts.max(initial=0):
            raise BadInput(f"emissions {emissions.shape} do not fit {len(self.tags)} tags and {counts.max()} tokens")
        return [self.decode_row(*row) for row in zip(texts, emissions, offsets, sentence_tokens)]
