"""flair's ViterbiDecoder.decode (sequence_tagger_utils/viterbi.py) for one sentence, in numpy float32."""
from __future__ import annotations

import numpy as np


class ViterbiDecoder:
    def __init__(self, transitions: np.ndarray, start_tag: int, stop_tag: int):
        self.transitions = np.asarray(transitions, dtype=np.float32)  # [to, from]
        self.start_tag, self.stop_tag = start_tag, stop_tag

    def decode(self, emissions: np.ndarray) -> tuple[list[int], list[float]]:
        """emissions [tokens, tags] -> (best tag path, per-token confidence). As flair: the confidence of
        token t is the largest softmax probability of the Viterbi scores accumulated up to t (whichever tag
        it belongs to)."""
        length = emissions.shape[0]
        if length == 0:
            return [], []
        # CRF.forward: features[t, to, from] = emission[t, to] + transitions[to, from]
        features = emissions.astype(np.float32)[:, :, None] + self.transitions[None, :, :]
        scores = np.empty((length, features.shape[1]), dtype=np.float32)
        backpointers = np.empty((length, features.shape[1]), dtype=np.int64)
        scores[0] = features[0, :, self.start_tag]
        for t in range(1, length):
            candidates = features[t] + scores[t - 1][None, :]
            backpointers[t] = candidates.argmax(axis=1)
            scores[t] = candidates[np.arange(candidates.shape[0]), backpointers[t]]
        best = int((scores[length - 1] + self.transitions[self.stop_tag]).argmax())
        path = [best]
        for t in range(length - 1, 0, -1):
            best = int(backpointers[t, best])
            path.append(best)
        path.reverse()
        exp = np.exp(scores - scores.max(axis=1, keepdims=True))
        confidences = (exp / exp.sum(axis=1, keepdims=True)).max(axis=1)
        return path, [float(c) for c in confidences]
