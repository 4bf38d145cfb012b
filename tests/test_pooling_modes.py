"""The numpy pooling stage equals sentence-transformers' own Pooling (+ Normalize) module on random
tensors with padding, for every mode the generated models use; the stage reads its mode from config."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mean_pooling.pooling import MODES, pool

ROWS, LENGTH, HIDDEN = 5, 9, 16
LENGTHS = [9, 1, 4, 7, 2]  # right padding; one row unpadded, one of a single token


def random_batch(seed: int):
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(ROWS, LENGTH, HIDDEN)).astype(np.float32)
    mask = np.zeros((ROWS, LENGTH), dtype=np.int64)
    for row, n in enumerate(LENGTHS):
        mask[row, :n] = 1
    hidden[mask == 0] = rng.normal(scale=50, size=hidden[mask == 0].shape)  # padding must not leak in
    return hidden, mask


def st_pooling(mode: str, hidden: np.ndarray, mask: np.ndarray, normalize: bool) -> np.ndarray:
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    features = {"token_embeddings": torch.from_numpy(hidden), "attention_mask": torch.from_numpy(mask)}
    features = Pooling(HIDDEN, pooling_mode=mode)(features)
    if normalize:
        features = Normalize()(features)
    return features["sentence_embedding"].numpy()


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_pool_equals_sentence_transformers(mode, normalize):
    hidden, mask = random_batch(seed=MODES.index(mode))
    got = pool(hidden, mask, mode, normalize)
    assert got.dtype == np.float32 and got.shape == (ROWS, HIDDEN)
    np.testing.assert_allclose(got, st_pooling(mode, hidden, mask, normalize), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_a_row_does_not_depend_on_its_padding(mode):
    hidden, mask = random_batch(seed=7)
    alone = pool(hidden[3:4, :LENGTHS[3]], mask[3:4, :LENGTHS[3]], mode, True)
    np.testing.assert_allclose(pool(hidden, mask, mode, True)[3:4], alone, rtol=1e-6, atol=1e-6)


def test_unknown_mode_is_refused():
    hidden, mask = random_batch(seed=1)
    with pytest.raises(ValueError, match="pooling mode"):
        pool(hidden, mask, "median")


def _stage(mode: str | None, normalize: str | None):
    from mean_pooling.model import TritonPythonModel

    params = {k: {"string_value": v} for k, v in (("mode", mode), ("normalize", normalize)) if v is not None}
    model = TritonPythonModel()
    model.initialize({"model_config": json.dumps({"name": "p", "parameters": params})})
    return model


def test_stage_reads_mode_and_normalize_from_config():
    model = _stage("max", "false")
    assert (model.mode, model.normalize) == ("max", False)
    default = _stage(None, None)  # the shipped text_embedding_pooling config sets neither
    assert (default.mode, default.normalize) == ("mean", True)
    with pytest.raises(ValueError, match="pooling mode"):
        _stage("median", None)
