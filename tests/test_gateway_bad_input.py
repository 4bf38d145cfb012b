"""Bad input through the live gateway: each is refused with a 4xx in the error shape, with a message that
says what is wrong (naming the setting when a limit is hit), before any work; the service keeps serving."""
from __future__ import annotations

import io

import pytest
from PIL import Image

from gateway_helpers import CLIP_DEMO, MINILM, b64, error_of, png_bytes

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gw(gateway):
    gateway.triton.load("text_embedding")
    r = gateway.http.post("/load_clip_model", json={"model_name": CLIP_DEMO})
    assert r.status_code == 200, r.text
    return gateway


def huge_png(width: int = 8000, height: int = 8000) -> bytes:
    """A small file whose header says 64 megapixels (1-bit, one colour: compresses to a few KiB)."""
    buffer = io.BytesIO()
    Image.new("1", (width, height)).save(buffer, "PNG")
    return buffer.getvalue()


def post_json(gw, path: str, body):
    return gw.http.post(path, json=body)


CASES = {
    # name: (path, body or raw bytes, status, words the message must contain)
    "unknown model": ("/v1/embeddings", {"model": "no-such/model", "input": "hi"}, 404, ["no-such/model", "not loaded"]),
    "unknown model /infer": ("/infer", {"model_name": "nope-model", "text": ["hi"]}, 404, ["nope-model"]),
    "malformed JSON": ("/v1/embeddings", b'{"model": "x", "input": [', 400, ["JSON"]),
    "missing input": ("/v1/embeddings", {"model": MINILM}, 400, ["input"]),
    "empty input list": ("/v1/embeddings", {"model": MINILM, "input": []}, 400, ["input", "empty"]),
    "empty string": ("/v1/embeddings", {"model": MINILM, "input": ""}, 400, ["empty"]),
    "token ids": ("/v1/embeddings", {"model": MINILM, "input": [[101, 2023, 102]]}, 400, ["input"]),
    "too many inputs": ("/v1/embeddings", {"model": MINILM, "input": ["a"] * 2049}, 400, ["2049", "MAX_INPUTS"]),
    "text too long": ("/v1/embeddings", {"model": MINILM, "input": "x" * (64 * 1024 + 1)}, 413, ["MAX_TEXT_BYTES"]),
    # 1..MAX_DIMENSIONS is the schema's (a 400); over the named model's own dimension, a 409 (issue 52)
    "dimensions 0": ("/v1/embeddings", {"model": MINILM, "input": "hi", "dimensions": 0}, 400, ["dimensions", "1"]),
    "dimensions negative": ("/v1/embeddings", {"model": MINILM, "input": "hi", "dimensions": -3}, 400, ["dimensions"]),
    "dimensions too big": ("/v1/embeddings", {"model": MINILM, "input": "hi", "dimensions": 385}, 409,
                           ["dimensions", "384"]),
    "dimensions absurd": ("/v1/embeddings", {"model": MINILM, "input": "hi", "dimensions": 3.6e18}, 400,
                          ["dimensions"]),
    "bad encoding_format": ("/v1/embeddings", {"model": MINILM, "input": "hi", "encoding_format": "hex"}, 400,
                            ["encoding_format"]),
    "infer without inputs": ("/infer", {"model_name": CLIP_DEMO}, 400, ["text or image"]),
    "not base64": ("/infer", {"model_name": CLIP_DEMO, "image": ["%%% not an image %%%"]}, 400, ["base64"]),
    "non-image": ("/infer", {"model_name": CLIP_DEMO, "image": [b64(b"just some text, not a picture")]}, 400,
                  ["not an image"]),
    "over megapixels": ("/infer", {"model_name": CLIP_DEMO, "image": [b64(huge_png())]}, 413,
                        ["64.0 megapixels", "MAX_IMAGE_MEGAPIXELS"]),
    "url not allowlisted": ("/infer", {"model_name": CLIP_DEMO, "image": ["https://example.com/cat.jpg"]}, 400,
                            ["IMAGE_URL_ALLOWLIST"]),
    "loopback url": ("/infer", {"model_name": CLIP_DEMO, "image": ["http://127.0.0.1:1/x.png"]}, 400,
                     ["IMAGE_URL_ALLOWLIST"]),
    "images for a text model": ("/infer", {"model_name": MINILM, "image": [b64(png_bytes())]}, 409, ["images"]),
    "too many images": ("/infer", {"model_name": CLIP_DEMO, "image": [b64(png_bytes())] * 2049}, 400, ["MAX_INPUTS"]),
    "path outside roots": ("/load_sentence_transformer_model", {"model_name": "/etc"}, 403, ["MODEL_ROOTS"]),
    "dot-dot path": ("/load_sentence_transformer_model", {"model_name": "../../etc/ssl"}, 400, ["'..'"]),
    "not a model folder": ("/load_sentence_transformer_model", {"model_name": "gateway"}, 400, ["modules.json"]),
    "unknown open_clip pair": ("/load_clip_model", {"model_name": "ViT-B-32", "pretrained": "no_such_tag"}, 400,
                               ["ViT-B-32", "no_such_tag"]),
    "unload unknown": ("/unload_model", {"model_name": "never-loaded/model"}, 404, ["never-loaded/model"]),
    "unload shipped": ("/unload_model", {"model_name": MINILM}, 409, ["shipped"]),
    "delete shipped": ("/delete_model", {"model_name": MINILM}, 409, ["shipped"]),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_refused_with_a_clear_message_and_still_serving(gw, case):
    path, body, status, words = CASES[case]
    if isinstance(body, bytes):
        r = gw.http.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = post_json(gw, path, body)
    assert r.status_code == status, r.text
    error = error_of(r)  # its request_id is the response's x-request-id
    assert set(error) == {"message", "type", "param", "code"}, error
    for word in words:
        assert word.lower() in error["message"].lower(), error
    assert "Traceback" not in r.text
    ok = post_json(gw, "/v1/embeddings", {"model": MINILM, "input": "still serving"})
    assert ok.status_code == 200, ok.text
    ok = post_json(gw, "/infer", {"model_name": CLIP_DEMO, "image": [b64(png_bytes())]})
    assert ok.status_code == 200 and len(ok.json()["image_embeddings"]) == 1, ok.text
