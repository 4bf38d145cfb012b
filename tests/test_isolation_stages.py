"""Unit tier: an unexpected failure inside a stage reaches its client as INTERNAL with an id and nothing
else (no traceback, no exception text); the details, under the same id, go to the server log."""
from __future__ import annotations

import logging
import re

import numpy as np
import pytest

import fake_pb_utils as pb
from model_configs import load_python_model

ID_ONLY = re.compile(r"^internal error \(id ([0-9a-f]{12}), see the server log\)$")


def assert_internal_with_id_only(response, caplog, secret: str) -> None:
    assert response.has_error() and response.error().code() == pb.TritonError.INTERNAL
    message = response.error().message()
    match = ID_ONLY.match(message)
    assert match, message
    assert "Traceback" not in message and secret not in message and "File \"" not in message
    logged = [r.getMessage() for r in caplog.records if match.group(1) in r.getMessage()]
    assert logged and "Traceback" in logged[0] and secret in logged[0], "the details are in the server log"


def test_tagger_failure_inside_the_forward_is_internal_with_an_id(caplog):
    caplog.set_level(logging.ERROR, logger="stage")
    tagger = load_python_model("ner_tagger")

    def explode(*_args):
        raise RuntimeError("secret detail: /home/user/weights.bin at 0xdeadbeef")

    tagger.runner.emissions = explode
    from ner_preprocess.preprocessing import NerPreprocessor
    from model_configs import MODEL_REPOSITORY

    encoded = NerPreprocessor(MODEL_REPOSITORY / "ner_preprocess" / "1" / "char_lm.json").encode(["Paris is nice."])
    (response,) = tagger.execute([pb.InferenceRequest({k: encoded[k] for k in (
        "char_ids", "sentence_chars", "sentence_tokens", "token_positions", "token_count")})])
    assert_internal_with_id_only(response, caplog, "secret detail")


def test_classifier_fed_impossible_pixels_is_internal_with_an_id(caplog):
    caplog.set_level(logging.ERROR, logger="stage")
    classifier = load_python_model("food_captioning_classifier")
    ok, bad = classifier.execute([pb.InferenceRequest({"pixel_values": np.zeros((1, 3, 224, 224), np.float32)}),
                                  pb.InferenceRequest({"pixel_values": np.zeros((1, 3, 0, 0), np.float32)})])
    assert not ok.has_error()
    assert_internal_with_id_only(bad, caplog, "Error")


@pytest.mark.parametrize("model", ["text_embedding_tokenizer", "ner_preprocess", "ner_decoder"])
def test_torch_free_stages_report_unexpected_errors_with_an_id(model, caplog, monkeypatch):
    caplog.set_level(logging.ERROR, logger="stage")
    stage = load_python_model(model)
    owner, method = {"text_embedding_tokenizer": ("tokenizer", "encode_per_request"),
                     "ner_preprocess": ("preprocessor", "encode"), "ner_decoder": ("decoder", "decode")}[model]

    def explode(*_args):
        raise KeyError("secret-key-material")

    monkeypatch.setattr(getattr(stage, owner), method, explode)
    inputs = {"text": np.array([[b"Paris"]], dtype=object)}
    if model == "ner_decoder":
        inputs.update(emissions=np.zeros((1, 1, 19), np.float32), token_offsets=np.zeros((1, 1, 2), np.int64),
                      sentence_tokens=np.ones((1, 1), np.int64), token_count=np.ones((1, 1), np.int64))
    (response,) = stage.execute([pb.InferenceRequest(inputs)])
    assert_internal_with_id_only(response, caplog, "secret-key-material")


def test_a_request_that_breaks_the_shared_tagger_forward_fails_alone(caplog):
    """Whatever passes validation but still makes the forward raise fails its own request only: the
    batch is run again request by request."""
    caplog.set_level(logging.ERROR, logger="stage")
    from model_configs import MODEL_REPOSITORY
    from ner_preprocess.preprocessing import NerPreprocessor

    tagger = load_python_model("ner_tagger")
    real = tagger.runner.emissions

    def fragile(char_ids, *rest):
        if (char_ids == 7).any():  # stands for an input the model cannot take
            raise RuntimeError("secret shape mismatch")
        return real(char_ids, *rest)

    tagger.runner.emissions = fragile
    preprocessor = NerPreprocessor(MODEL_REPOSITORY / "ner_preprocess" / "1" / "char_lm.json")
    keys = ("char_ids", "sentence_chars", "sentence_tokens", "token_positions", "token_count")
    good = [preprocessor.encode([t]) for t in ("Paris is nice.", "Angela Merkel met Obama.")]
    bad = preprocessor.encode(["Paris is nice."])
    bad["char_ids"][0, 0, 2] = 7
    responses = tagger.execute([pb.InferenceRequest({k: e[k] for k in keys}) for e in (good[0], bad, good[1])])
    assert not responses[0].has_error() and not responses[2].has_error()
    alone = tagger.execute([pb.InferenceRequest({k: good[1][k] for k in keys})])[0]
    np.testing.assert_allclose(responses[2].output("emissions"), alone.output("emissions"), atol=1e-5)
    assert_internal_with_id_only(responses[1], caplog, "secret shape mismatch")


def test_a_request_that_breaks_the_shared_encoder_forward_fails_alone(caplog):
    """The text encoder too: a batch whose forward raises is run again request by request."""
    caplog.set_level(logging.ERROR, logger="stage")
    encoder = load_python_model("text_embedding_encoder")
    real = encoder.encoder.forward

    def fragile(ids, mask):
        if (ids == 7).any():  # stands for an input the model cannot take
            raise RuntimeError("secret kernel failure")
        return real(ids, mask)

    encoder.encoder.forward = fragile
    rows = [np.array([[101, 2000, 2003, 102]]), np.array([[101, 7, 102]]), np.array([[101, 3000, 102]])]
    responses = encoder.execute([pb.InferenceRequest({"input_ids": r, "attention_mask": np.ones_like(r)}) for r in rows])
    assert not responses[0].has_error() and not responses[2].has_error()
    (alone,) = encoder.execute([pb.InferenceRequest({"input_ids": rows[2], "attention_mask": np.ones_like(rows[2])})])
    np.testing.assert_allclose(responses[2].output("token_embeddings"), alone.output("token_embeddings"), atol=1e-5)
    assert_internal_with_id_only(responses[1], caplog, "secret kernel failure")
