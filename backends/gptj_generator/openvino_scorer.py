"""What the OpenVINO engine cannot get from its pipeline (ContinuousBatchingPipeline exposes no logits: the chosen
token's logprob only, and no logits hook): the logits themselves, from a plain OpenVINO compile of the same IR
(stateful: one InferRequest per request keeps that request's KV cache). Used only by requests that need them:
top logprobs alternatives, the prompt's logprobs (echo) and token healing's constrained first id(s). Compiled on
first use (a second copy of the weights in memory: docs/pipelines.md, "The OpenVINO engine"); f32 as the
pipeline, so its logprobs equal the torch reference's (1e-4)."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np


class Scorer:
    def __init__(self, ir_dir: Path, properties: dict):
        # the pipeline's properties less its own (the CPU plugin refuses the sampler's)
        self.ir_dir = Path(ir_dir)
        self.properties = {k: v for k, v in properties.items() if k != "sampler_num_threads"}
        self._compiled = None
        self._lock = threading.Lock()

    def session(self) -> "ScoringSession":
        with self._lock:
            if self._compiled is None:
                import openvino

                self._compiled = openvino.Core().compile_model(str(self.ir_dir / "openvino_model.xml"), "CPU",
                                                               self.properties)
        return ScoringSession(self._compiled)


class ScoringSession:
    """One sequence fed a piece at a time; after each feed, `row(i)` is the raw logits predicting the id after the
    fed piece's i-th (`next_row`: the id that follows everything fed), for sampling.py's token_logprob and
    healing's choose (which normalize one row at a time: a long prompt's every row at once would be prompt x
    vocabulary float64s)."""

    def __init__(self, compiled):
        self._request = compiled.create_infer_request()
        self._request.reset_state()
        self._output = compiled.output(0)
        self.fed = 0
        self._logits: np.ndarray | None = None

    def feed(self, ids: list[int]) -> None:
        n = len(ids)
        out = self._request.infer({"input_ids": np.array([ids], np.int64),
                                   "attention_mask": np.ones((1, self.fed + n), np.int64),
                                   "position_ids": np.arange(self.fed, self.fed + n, dtype=np.int64)[None],
                                   "beam_idx": np.zeros(1, np.int32)})
        self.fed += n
        self._logits = out[self._output][0]

    def row(self, i: int) -> np.ndarray:
        return self._logits[i]

    @property
    def next_row(self) -> np.ndarray:
        return self.row(-1)
