"""The embedding service through the live gateway: fidelity to sentence-transformers and CLIPModel,
the OpenAI SDK unchanged, base64 and `dimensions`."""
from __future__ import annotations

import base64

import numpy as np
import pytest

from gateway_helpers import (CLIP_DEMO, MINILM, ST_CLS_DEMO, b64, clip_image_features, clip_text_features,
                             minilm_path, normalized, png_bytes)

pytestmark = pytest.mark.integration
TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "  The girl is carrying a baby.  ",
         "Ünïcödé text, with punctuation!?", "x " * 400]


@pytest.fixture(scope="module")
def served(gateway):
    gateway.triton.load("text_embedding")
    for path, name in (("/load_clip_model", CLIP_DEMO), ("/load_sentence_transformer_model", ST_CLS_DEMO),
                       ("/load_sentence_transformer_model", minilm_path())):
        r = gateway.http.post(path, json={"model_name": name})
        assert r.status_code == 200, r.text
    return gateway


def st_reference(path: str, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path, device="cpu").encode(texts, normalize_embeddings=True)


@pytest.mark.parametrize("model", [MINILM, "local-minilm", ST_CLS_DEMO])
def test_v1_embeddings_equal_sentence_transformers(served, model):
    from model_configs import ROOT

    name = minilm_path() if model == "local-minilm" else model
    reference = st_reference(minilm_path() if model in (MINILM, "local-minilm") else str(ROOT / model), TEXTS)
    # TEXTS[-1] (402 tokens) is over every model's maximum: cut as sentence-transformers cuts it, when asked
    r = served.http.post("/v1/embeddings", json={"model": name, "input": TEXTS, "truncate": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == name
    assert [d["index"] for d in body["data"]] == list(range(len(TEXTS)))
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    np.testing.assert_allclose(got, reference, atol=1e-5)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > len(TEXTS)


def test_registered_encoders_run_on_onnx_runtime(served, data_dir):
    """The gateway exported each registered model's encoder (in a subprocess, cached in DATA_DIR/onnx_cache)
    and /loaded_models says which runtime serves it."""
    listed = {m["model_name"]: m for m in served.http.get("/loaded_models").json()["models"]}
    for name in (CLIP_DEMO, ST_CLS_DEMO, minilm_path(), MINILM):
        assert listed[name]["runtime"] == "onnx", listed[name]
    assert list((data_dir / "onnx_cache").glob("*/text.onnx")) and list((data_dir / "onnx_cache").glob("*/model.onnx"))


def test_infer_equals_sentence_transformers_and_base64_is_the_same_floats(served):
    reference = st_reference(minilm_path(), TEXTS[:3])
    r = served.http.post("/infer", json={"model_name": MINILM, "text": TEXTS[:3]})
    assert r.status_code == 200, r.text
    body = r.json()
    np.testing.assert_allclose(np.array(body["text_embeddings"]), reference, atol=1e-5)
    assert body["image_embeddings"] == [] and body["processingTimeMs"] > 0
    b = served.http.post("/v1/embeddings", json={"model": MINILM, "input": TEXTS[:3], "encoding_format": "base64"}).json()
    decoded = np.array([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in b["data"]])
    np.testing.assert_allclose(decoded, reference, atol=1e-5)


def test_clip_text_and_image_equal_clipmodel(served):
    texts = ["a photo of a cat", "a red square on a blue background", "stripes"]
    images = [png_bytes((80, 60), (200, 30, 30)), png_bytes((64, 64), (10, 200, 10), pattern=2),
              png_bytes((300, 120), (20, 20, 220), pattern=5)]
    r = served.http.post("/infer", json={"model_name": CLIP_DEMO, "text": texts,
                                         "image": [b64(images[0]), "data:image/png;base64," + b64(images[1]), b64(images[2])]})
    assert r.status_code == 200, r.text
    body = r.json()
    np.testing.assert_allclose(np.array(body["text_embeddings"]), clip_text_features(texts), atol=1e-5)
    np.testing.assert_allclose(np.array(body["image_embeddings"]), clip_image_features(images), atol=1e-5)
    raw = served.http.post("/infer", json={"model_name": CLIP_DEMO, "text": texts[:1], "normalize": False}).json()
    assert abs(np.linalg.norm(raw["text_embeddings"][0]) - 1) > 1e-3, "normalize=false returns the raw features"
    np.testing.assert_allclose(normalized(raw["text_embeddings"]), clip_text_features(texts[:1]), atol=1e-5)


def test_openai_sdk_unchanged(served):
    from openai import OpenAI

    client = OpenAI(base_url=served.url + "/v1", api_key="unused")
    reference = st_reference(minilm_path(), TEXTS[:2])
    default = client.embeddings.create(model=MINILM, input=TEXTS[:2])  # the SDK asks for base64 by default
    np.testing.assert_allclose(np.array([d.embedding for d in default.data]), reference, atol=1e-5)
    floats = client.embeddings.create(model=MINILM, input=TEXTS[0], encoding_format="float")
    np.testing.assert_allclose(floats.data[0].embedding, reference[0], atol=1e-5)
    short = client.embeddings.create(model=MINILM, input=TEXTS[:2], dimensions=64)
    got = np.array([d.embedding for d in short.data])
    assert got.shape == (2, 64)
    np.testing.assert_allclose(got, normalized(reference[:, :64]), atol=1e-5)
    assert default.usage.prompt_tokens > 0
    assert MINILM in [m.id for m in client.models.list().data]


def test_concurrent_requests_share_triton_calls_and_each_gets_its_own_vector(served):
    """gateway/triton/coalesce.py against the real ensemble: 48 requests at once, one sentence each, while at most
    COALESCE_CALLS (4) calls are in flight: fewer Triton requests than HTTP requests, every row answered
    once, and each request's vector is its own sentence's."""
    from triton_fixtures import concurrently

    subjects = ["A chef", "The old dog", "Two children", "A pilot", "My neighbour", "The committee"]
    actions = ["cooks dinner", "sleeps by the fire", "reads a long book", "lands in the rain", "paints the fence",
               "votes on the budget", "plays chess at noon", "sings in the choir"]
    texts = [f"{s} {a}." for s in subjects for a in actions]  # 48 different sentences
    reference = st_reference(minilm_path(), texts)
    before = served.triton.stats("text_embedding")
    responses = concurrently(lambda text: served.http.post("/v1/embeddings", json={"model": MINILM, "input": text}),
                             texts)
    after = served.triton.stats("text_embedding")
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200][:2]
    got = np.array([r.json()["data"][0]["embedding"] for r in responses], dtype=np.float32)
    np.testing.assert_allclose(got, reference, atol=1e-5)
    rows = after.inference_count - before.inference_count
    calls = after.inference_stats.success.count - before.inference_stats.success.count
    assert rows == 48 and calls < 48, (rows, calls)
