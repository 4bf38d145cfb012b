"""Token healing, the generator's half (the preprocessing backs off the prompt's last token: codegen_preprocess/
healing.py): the first generated id(s) must spell out the bytes that were backed off, then generation goes on
freely. An id is allowed while it starts with what is left to spell, or is a non-empty start of it (then the
next id spells the rest). Engine-free: both engines choose the constrained ids with `choose()`, the torch engine
from its step's logits, the OpenVINO engine (whose pipeline takes no logits hook) from its scorer's
(openvino_scorer.py) before the pipeline takes over."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from gptj_generator.sampling import sample
from gptj_generator.seam import SamplingParams
from stage_common.errors import BadInput

# the preprocessing backs off one token (its bytes); a direct caller of codegen_generator may send anything:
# bounded before any scan of the vocabulary
MAX_HEAL_PREFIX_BYTES = 256


class AllowedIds:
    """Ids allowed for each remaining prefix, per vocabulary (one scan of the vocabulary per new prefix)."""

    def __init__(self, token_bytes: Sequence[bytes]):
        self.token_bytes = token_bytes
        self._cache: dict[bytes, np.ndarray] = {}

    def __call__(self, prefix: bytes) -> np.ndarray:
        ids = self._cache.get(prefix)
        if ids is None:
            ids = np.array([i for i, b in enumerate(self.token_bytes)
                            if b and (b.startswith(prefix) or prefix.startswith(b))], dtype=np.int64)
            if len(self._cache) < 4096:  # prefixes repeat (a newline, indentation): bounded anyway
                self._cache[prefix] = ids
        return ids


class Healing:
    """One request's constraint: `active` while bytes are left to spell; `advance` with each chosen id."""

    def __init__(self, allowed_ids: AllowedIds, prefix: bytes):
        if len(prefix) > MAX_HEAL_PREFIX_BYTES:
            raise BadInput(f"heal_prefix is {len(prefix)} bytes, over {MAX_HEAL_PREFIX_BYTES}")
        self._allowed_ids, self.remaining = allowed_ids, prefix
        self.allowed()  # at submit: a prefix no id spells is this request's error, not the engine loop's

    @property
    def active(self) -> bool:
        return bool(self.remaining)

    def allowed(self) -> np.ndarray:
        ids = self._allowed_ids(self.remaining)
        if not len(ids):  # no id spells it (cannot happen for a prefix cut from the prompt's own ids)
            raise BadInput(f"no token of this model starts with heal_prefix {self.remaining[:32]!r}")
        return ids

    def advance(self, token: int) -> None:
        spelled = self._allowed_ids.token_bytes[token]
        self.remaining = self.remaining[len(spelled):] if self.remaining.startswith(spelled) else b""


def choose(logits, allowed, sampling: SamplingParams, generator) -> int:
    """One id among `allowed` (ids, ascending) from a [vocab] row of raw logits, numpy or torch: the engines' one
    sampler (sampling.py) over the allowed ids only (`generator`: sampling.new_generator's, None when greedy)."""
    return int(allowed[sample(logits[allowed], sampling, generator)])
