"""Live-server tier: the text_embedding ensemble through a real tritonserver."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from model_configs import MODEL_REPOSITORY
from string_tensors import string_rows
from triton_fixtures import assert_invalid_argument, concurrently

pytestmark = pytest.mark.integration

TEXTS = [
    "A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
    "A man is riding a horse.", "A woman is playing violin.", "Two men pushed carts through the woods.",
    "", " ", "   leading and trailing   ", "multiple     inner\t\twhitespace\n\nlines",
    "Ünïcödé naïve café crème brûlée", "Привет, как дела?", "東京は日本の首都です。", "مرحبا بالعالم",
    "emoji 🙂🚀🍕 and ZWJ 👩‍👩‍👧", "!!!???...", "x", "The quick brown fox jumps over the lazy dog. " * 30,
]


@pytest.fixture(scope="module")
def server(triton):
    triton.load("text_embedding")
    return triton


@pytest.fixture(scope="module")
def reference():
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(1)
    return SentenceTransformer(str(MODEL_REPOSITORY / "text_embedding_encoder" / "1"), device="cpu")


def embed(url, texts):
    result = grpcclient.InferenceServerClient(url).infer("text_embedding", [string_rows("text", texts)])
    return result.as_numpy("embedding")


def test_served_embeddings_equal_sentence_transformers(server, reference):
    got = embed(server.grpc_url, TEXTS)
    assert got.shape == (len(TEXTS), 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, reference.encode(TEXTS, normalize_embeddings=True), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_text_at_the_byte_limit_is_truncated_like_sentence_transformers_one_byte_more_is_refused(server, reference):
    text = ("lorem ipsum dolor sit amet " * 4000)[:100_000]  # max_text_bytes
    np.testing.assert_allclose(embed(server.grpc_url, [text])[0],
                               reference.encode([text], normalize_embeddings=True)[0], atol=1e-5)
    with pytest.raises(InferenceServerException) as raised:
        embed(server.grpc_url, [text + "x"])
    assert "INVALID_ARGUMENT" in str(raised.value.status())
    assert "100001, over the limit of 100000 (model parameter max_text_bytes)" in raised.value.message()


def test_batch_of_one_and_batch_of_64(server, reference):
    texts = [f"sentence number {i} about {'cats' if i % 2 else 'the stock market'}" for i in range(64)]
    expected = reference.encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose(embed(server.grpc_url, texts[:1]), expected[:1], atol=1e-5)
    np.testing.assert_allclose(embed(server.grpc_url, texts), expected, atol=1e-5)


def test_concurrent_clients_get_their_own_rows_and_are_batched(server, reference):
    texts = [("word " * (i % 13)) + f"client {i} says {i * 7919}" for i in range(32)]
    expected = reference.encode(texts, normalize_embeddings=True)
    before = server.stats("text_embedding_encoder")
    with ThreadPoolExecutor(32) as pool:
        got = list(pool.map(lambda t: embed(server.grpc_url, [t])[0], texts))
    np.testing.assert_allclose(np.stack(got), expected, atol=1e-5)
    after = server.stats("text_embedding_encoder")
    inferences = after.inference_count - before.inference_count
    executions = after.execution_count - before.execution_count
    assert inferences == 32
    assert executions < inferences, "the dynamic batcher never grouped requests"


def test_invalid_utf8_fails_only_its_own_request(server, reference):
    texts = [f"good request {i}" for i in range(15)]
    jobs = texts[:7] + [b"caf\xe9 latin-1"] + texts[7:]
    results = concurrently(lambda text: embed(server.grpc_url, [text])[0], jobs)
    assert_invalid_argument(results.pop(7), "not valid UTF-8")
    np.testing.assert_allclose(np.stack(results), reference.encode(texts, normalize_embeddings=True), atol=1e-5)
    np.testing.assert_allclose(embed(server.grpc_url, ["still serving"]),
                               reference.encode(["still serving"], normalize_embeddings=True), atol=1e-5)


def test_wrong_dtype_and_shape_are_rejected_clearly(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    wrong_dtype = grpcclient.InferInput("text", [1, 1], "INT32")
    wrong_dtype.set_data_from_numpy(np.array([[3]], dtype=np.int32))
    with pytest.raises(InferenceServerException, match="(?i)data-type|datatype|TYPE_STRING|BYTES"):
        client.infer("text_embedding", [wrong_dtype])
    wrong_shape = grpcclient.InferInput("text", [1, 2], "BYTES")
    wrong_shape.set_data_from_numpy(np.array([[b"a", b"b"]], dtype=object))
    with pytest.raises(InferenceServerException, match="(?i)shape"):
        client.infer("text_embedding", [wrong_shape])
    assert embed(server.grpc_url, ["ok"]).shape == (1, 384)
