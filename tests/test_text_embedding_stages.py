"""Unit tier: the text_embedding stages without a server, against sentence-transformers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fake_pb_utils as pb
from mean_pooling.pooling import mean_pool_normalize
from model_configs import MODEL_REPOSITORY, load_python_model
from text_tokenizer.tokenization import TextTokenizer
from stage_common.padding import pad_together

TEXTS = ["A man is eating food.", "", "   padded   ", "Ünïcödé naïve café 東京 🙂", "word " * 400]


@pytest.fixture(scope="module")
def reference():
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(1)
    return SentenceTransformer(str(MODEL_REPOSITORY / "text_embedding_encoder" / "1"), device="cpu")


@pytest.fixture(scope="module")
def tokenizer():
    return TextTokenizer(MODEL_REPOSITORY / "text_embedding_tokenizer" / "1" / "tokenizer.json", 256)


def test_tokenizer_matches_sentence_transformers(tokenizer, reference):
    ids, mask = tokenizer.encode(TEXTS)
    expected = reference.tokenize(TEXTS)
    np.testing.assert_array_equal(ids, expected["input_ids"].numpy())
    np.testing.assert_array_equal(mask, expected["attention_mask"].numpy())
    assert ids.shape[1] == 256, "the long text is truncated to max_seq_length"


def test_tokenizer_pads_each_request_on_its_own(tokenizer):
    short, long = tokenizer.encode_per_request([["hi"], ["a much longer sentence than the first"]])
    assert short[0].shape == (1, 3) and long[0].shape[1] > 3
    assert short[1].sum() == 3


def test_pad_together_right_pads_rows():
    out = pad_together([np.array([[1, 2]]), np.array([[3], [4]])])
    np.testing.assert_array_equal(out, [[1, 2], [3, 0], [4, 0]])


def test_mean_pooling_ignores_padding_and_normalizes():
    hidden = np.array([[[1.0, 0.0], [3.0, 4.0], [100.0, 100.0]]], dtype=np.float32)
    out = mean_pool_normalize(hidden, np.array([[1, 1, 0]]))
    np.testing.assert_allclose(out, [[2 / np.hypot(2, 2), 2 / np.hypot(2, 2)]], rtol=1e-6)


def test_stages_in_process_equal_sentence_transformers(reference):
    tok, enc, pool = (load_python_model(m) for m in
                      ("text_embedding_tokenizer", "text_embedding_encoder", "text_embedding_pooling"))
    rows = [[t.encode()] for t in TEXTS]
    (tok_resp,) = tok.execute([pb.InferenceRequest({"text": np.array(rows, dtype=object)})])
    ids, mask = tok_resp.output("input_ids"), tok_resp.output("attention_mask")
    (enc_resp,) = enc.execute([pb.InferenceRequest({"input_ids": ids, "attention_mask": mask})])
    (pool_resp,) = pool.execute([pb.InferenceRequest({"token_embeddings": enc_resp.output("token_embeddings"),
                                                      "attention_mask": mask})])
    expected = reference.encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(pool_resp.output("embedding"), expected, atol=1e-5)


def test_tokenizer_model_fails_only_the_bad_request():
    tok = load_python_model("text_embedding_tokenizer")
    good = pb.InferenceRequest({"text": np.array([[b"fine"]], dtype=object)})
    bad = pb.InferenceRequest({"text": np.array([[b"\xff\xfe bad"]], dtype=object)})
    first, second, third = tok.execute([good, bad, good])
    assert not first.has_error() and not third.has_error()
    assert second.error().code() == pb.TritonError.INVALID_ARG
    assert "not valid UTF-8" in second.error().message()


def test_encoder_refuses_ids_outside_the_vocabulary_and_rows_over_512_tokens_per_request():
    """Either would make the shared forward raise for every batch-mate: refused before it runs."""
    enc = load_python_model("text_embedding_encoder")
    ids, mask = np.array([[101, 2000, 102]], np.int64), np.ones((1, 3), np.int64)
    responses = enc.execute([pb.InferenceRequest({"input_ids": ids, "attention_mask": mask}),
                             pb.InferenceRequest({"input_ids": np.array([[101, 30522]], np.int64),
                                                  "attention_mask": np.ones((1, 2), np.int64)}),
                             pb.InferenceRequest({"input_ids": np.array([[-1, 5]], np.int64),
                                                  "attention_mask": np.ones((1, 2), np.int64)}),
                             pb.InferenceRequest({"input_ids": np.full((1, 513), 100, np.int64),
                                                  "attention_mask": np.ones((1, 513), np.int64)})])
    assert [r.has_error() for r in responses] == [False, True, True, True]
    assert all(r.error().code() == pb.TritonError.INVALID_ARG for r in responses[1:])
    assert "[0, 30522)" in responses[1].error().message() and "[0, 30522)" in responses[2].error().message()
    assert "513, over the limit of 512" in responses[3].error().message()
    assert responses[0].output("token_embeddings").shape == (1, 3, 384)


def test_encoder_batches_requests_of_different_lengths(reference):
    enc = load_python_model("text_embedding_encoder")
    tokenizer = TextTokenizer(MODEL_REPOSITORY / "text_embedding_tokenizer" / "1" / "tokenizer.json", 256)
    (a_ids, a_mask), (b_ids, b_mask) = tokenizer.encode_per_request([["short"], ["a clearly longer input text"]])
    together = enc.execute([pb.InferenceRequest({"input_ids": a_ids, "attention_mask": a_mask}),
                            pb.InferenceRequest({"input_ids": b_ids, "attention_mask": b_mask})])
    alone = enc.execute([pb.InferenceRequest({"input_ids": a_ids, "attention_mask": a_mask})])
    assert together[0].output("token_embeddings").shape == (1, a_ids.shape[1], 384)
    np.testing.assert_allclose(together[0].output("token_embeddings"), alone[0].output("token_embeddings"),
                               atol=1e-5)


@pytest.mark.parametrize("runtime", ["onnx", "torch"])
def test_encoder_sorts_rows_into_small_forwards_without_changing_results(tokenizer, reference, runtime):
    """Both runtimes (ONNX Runtime over model.onnx, torch over the folder) equal sentence-transformers."""
    from transformer_encoder.encoder import make_encoder

    encoder = make_encoder(MODEL_REPOSITORY / "text_embedding_encoder" / "1", runtime, threads=1, rows_per_forward=2)
    requests = tokenizer.encode_per_request([TEXTS, ["one", "two words"], TEXTS[::-1]])
    pooled = [mean_pool_normalize(h, mask) for (_, mask), h in zip(requests, encoder.encode_per_request(requests))]
    for texts, got in zip([TEXTS, ["one", "two words"], TEXTS[::-1]], pooled):
        np.testing.assert_allclose(got, reference.encode(texts, normalize_embeddings=True), atol=1e-5)
    hidden = encoder.encode_per_request(requests[1:2])[0]
    assert not hidden[0, requests[1][1][0].sum():].any(), "padding positions are zero"


def long_texts(seed: int = 0) -> list[str]:
    """Texts far over 256 tokens: words, punctuation, accents, CJK, emoji, tabs and runs of spaces, and
    edge cases around the prefix the tokenizer reads first."""
    import random

    rnd = random.Random(seed)
    words = ["word", "Ünïcödé", "naïve", "東京", "🙂", "don't", "U.S.A.", "e\u0301cole", "ΣΊΣΥΦΟΣ", "x" * 120,
             "\u0301", "\t", "  ", "\u00a0", "a\x1cb", "...", "antidisestablishmentarianism"]
    texts = [" ".join(rnd.choice(words) for _ in range(rnd.randint(300, 3000))) for _ in range(40)]
    texts += ["word " * 254, "word " * 253 + "two words", "東京" * 3000, "a" * 9000 + " b",
              "\u0301 " * 5000 + "word " * 300, "x" * 50_000]
    return texts


def test_long_texts_tokenized_from_a_prefix_equal_sentence_transformers(tokenizer, reference):
    """The prefix shortcut is exact: equal to sentence-transformers' full tokenization + truncation."""
    texts = long_texts()
    assert tokenizer.prefix_chars == 16 * 256
    ids, mask = tokenizer.encode(texts)
    expected = reference.tokenize(texts)
    np.testing.assert_array_equal(ids, expected["input_ids"].numpy())
    np.testing.assert_array_equal(mask, expected["attention_mask"].numpy())
    small = TextTokenizer(MODEL_REPOSITORY / "text_embedding_tokenizer" / "1" / "tokenizer.json", 256, prefix_chars=300)
    np.testing.assert_array_equal(small.encode(texts)[0], ids)  # many doublings: still exact


def test_a_long_text_costs_a_prefix_not_the_whole_text(tokenizer, monkeypatch):
    seen = []
    encode_batch = tokenizer.tokenizer.encode_batch

    class Spy:
        def __getattr__(self, name):
            return getattr(encode_batch.__self__, name)

        def encode_batch(self, texts):
            seen.extend(len(t) for t in texts)
            return encode_batch(texts)

    monkeypatch.setattr(tokenizer, "tokenizer", Spy())
    tokenizer.encode(["word " * 20_000])
    assert seen and max(seen) <= tokenizer.prefix_chars


def test_text_over_max_text_bytes_is_refused_before_decoding():
    tok = load_python_model("text_embedding_tokenizer")
    assert tok.max_text_bytes == 100_000
    good = pb.InferenceRequest({"text": np.array([[b"fine"]], dtype=object)})
    huge = pb.InferenceRequest({"text": np.array([[b"ok"], [b"\xff" * 5_000_000]], dtype=object)})
    first, second, third = tok.execute([good, huge, good])
    assert not first.has_error() and not third.has_error()
    assert second.error().code() == pb.TritonError.INVALID_ARG
    # the size is checked first: these bytes are not even UTF-8
    assert second.error().message() == ("the size of 'text' row 1 (bytes) is 5000000, over the limit of 100000 "
                                        "(model parameter max_text_bytes)")
