"""POST /v1/ner and /v1/caption through the live gateway: the pipelines' own answers (the same as a direct
gRPC call), and every bad input refused with a 4xx in the error shape naming what is wrong."""
from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from gateway_helpers import png_bytes

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gw(gateway):
    gateway.triton.load("ner", "food_captioning")
    return gateway


def test_ner_answers_what_the_pipeline_does(gw):
    import tritonclient.grpc as grpcclient

    text = "Angela Merkel visited Paris. George Washington went to Washington."
    r = gw.http.post("/v1/ner", json={"text": text})
    assert r.status_code == 200, r.text
    tensor = grpcclient.InferInput("text", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
    direct = json.loads(gw.triton.client.infer("ner", [tensor]).as_numpy("entities")[0][0])
    assert r.json() == {"model": "ner", "entities": direct}
    for e in r.json()["entities"]:
        assert text[e["start"]:e["end"]] == e["text"]


def test_caption_answers_what_the_pipeline_does(gw):
    import tritonclient.grpc as grpcclient

    image = png_bytes((120, 90), (40, 160, 60), pattern=2)
    for sent in (base64.b64encode(image).decode(), "data:image/png;base64," + base64.b64encode(image).decode()):
        r = gw.http.post("/v1/caption", json={"image": sent})
        assert r.status_code == 200, r.text
        body = r.json()
        tensor = grpcclient.InferInput("image", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[image]], dtype=object))
        direct = gw.triton.client.infer("food_captioning", [tensor])
        assert body["label"] == direct.as_numpy("label")[0][0].decode()
        assert body["caption"] == direct.as_numpy("caption")[0][0].decode()
        assert body["score"] == pytest.approx(float(direct.as_numpy("score")[0][0]), abs=1e-6)


CASES = {
    "empty text": ("/v1/ner", {"text": " "}, 400, ["text", "empty"]),
    "text not a string": ("/v1/ner", {"text": ["a"]}, 400, ["text"]),
    "unknown field": ("/v1/ner", {"text": "a", "model": "x"}, 400, ["model"]),
    "text over MAX_TEXT_BYTES": ("/v1/ner", {"text": "a" * 70_000}, 413, ["MAX_TEXT_BYTES"]),
    "over the pipeline's max_request_characters": ("/v1/ner", {"text": "word " * 1_100}, 400, ["5000"]),
    "not an image": ("/v1/caption", {"image": base64.b64encode(b"plain text").decode()}, 400, ["image"]),
    "not base64": ("/v1/caption", {"image": "%%%"}, 400, ["base64"]),
    "no image": ("/v1/caption", {}, 400, ["image"]),
    "URL not allowed": ("/v1/caption", {"image": "http://127.0.0.1:9/x.png"}, 400, ["IMAGE_URL_ALLOWLIST"]),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_a_4xx_naming_the_problem(gw, case):
    path, body, status, words = CASES[case]
    r = gw.http.post(path, json=body)
    assert r.status_code == status, r.text
    message = r.json()["error"]["message"]
    for word in words:
        assert word in message, message
    assert "Traceback" not in r.text
    assert gw.http.post("/v1/ner", json={"text": "Paris"}).status_code == 200, "still serving"
