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

    def decode_row(self, text: str, emissions: np.ndarray, offsets: np.ndarray, count: int) -> str:
        path, confidences = self.viterbi.decode(emissions[:count])
        return entities_json(text, offsets, spans_from_bioes([self.tags[i] for i in path], confidences))

    def decode(self, texts: list[str], emissions: np.ndarray, offsets: np.ndarray, counts: np.ndarray) -> list[str]:
        counts = counts.reshape(-1)
        if not (len(texts) == emissions.shape[0] == offsets.shape[0] == len(counts)):
            raise BadInput(f"row counts differ: text {len(texts)}, emissions {emissions.shape[0]}, "
                           f"token_offsets {offsets.shape[0]}, token_count {len(counts)}")
        if emissions.shape[-1] != len(self.tags) or emissions.shape[1] < counts.max(initial=0):
            raise BadInput(f"emissions {emissions.shape} do not fit {len(self.tags)} tags and {counts.max()} tokens")
        return [self.decode_row(*row) for row in zip(texts, emissions, offsets, counts)]
