"""The tagger on ONNX Runtime (no torch in the stub): the graphs `make model` wrote from the same weights and
checked against the torch tagger (build/ner_onnx.py). The char LMs run in the same time segments as the
torch tagger, their LSTM state passed from one call to the next."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ner_tagger.rows import DIRECTIONS, TaggerRows
from ner_tagger.segments import plan_segments
from stage_common.gpu_placement import GpuPlacement
from stage_common.onnx_runtime import onnx_session

HEAD_FILE = "tagger_head.onnx"


def char_lm_file(direction: str) -> str:
    return f"char_lm_{direction}.onnx"


class _CharLM:
    def __init__(self, session, layers: int, hidden: int):
        self.session, self.layers, self.hidden = session, layers, hidden

    def read_at(self, char_ids: np.ndarray, lengths: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """char_ids [rows, chars] (row i valid up to lengths[i]), positions [rows, tokens] -> the LM's output
        at each position [rows, tokens, out]. Rows run longest first; a segment runs only the rows not yet
        finished (as the torch tagger's CharLM.read_at)."""
        order = np.argsort(-lengths, kind="stable")
        ids, pos = np.ascontiguousarray(char_ids[order].T), positions[order]
        h = c = np.zeros((self.layers, len(order), self.hidden), dtype=np.float32)
        out, start = None, 0
        for end, active in plan_segments(lengths[order].tolist()):
            segment, h, c = self.session.run(None, {"char_ids": np.ascontiguousarray(ids[start:end, :active]),
                                                    "h0": np.ascontiguousarray(h[:, :active]),
                                                    "c0": np.ascontiguousarray(c[:, :active])})
            if out is None:
                out = np.zeros((len(order), pos.shape[1], segment.shape[2]), dtype=np.float32)
            p = pos[:active]
            rows, tokens = np.nonzero((p >= start) & (p < end))
            out[rows, tokens] = segment[p[rows, tokens] - start, rows]
            start = end
        unsorted = np.empty_like(out)
        unsorted[order] = out
        return unsorted


class OnnxNerTagger(TaggerRows):
    runtime = "onnx"

    def __init__(self, model_dir: Path, threads: int, gpu: GpuPlacement | None = None):
        config = json.loads((Path(model_dir) / "tagger_config.json").read_text())

        def session(name: str):
            return onnx_session(Path(model_dir) / name, threads, gpu)

        self.lm_order = [lm["direction"] for lm in config["char_lms"]]  # flair's concatenation order
        self.char_lms = {lm["direction"]: _CharLM(session(char_lm_file(lm["direction"])), lm["nlayers"],
                                                  lm["hidden_size"]) for lm in config["char_lms"]}
        self.head = session(HEAD_FILE)
        self.num_tags = config["num_tags"]

    def char_lm_embeddings(self, char_ids: np.ndarray, char_count: np.ndarray,
                           token_positions: np.ndarray) -> np.ndarray:
        """Each token's char-LM embeddings [rows, tokens, dim], in flair's concatenation order."""
        parts = {direction: self.char_lms[direction].read_at(char_ids[:, d], char_count[:, d], token_positions[:, d])
                 for d, direction in enumerate(DIRECTIONS)}
        return np.concatenate([parts[d] for d in self.lm_order], axis=2)

    def _forward(self, char_ids, char_count, token_positions, token_count) -> np.ndarray:
        embeddings = self.char_lm_embeddings(char_ids, char_count, token_positions)
        return self.head.run(None, {"embeddings": embeddings, "token_count": token_count})[0]
