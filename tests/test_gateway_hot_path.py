"""The gateway's /v1/embeddings hot path without a server: the ModelInfer message built by hand equals
tritonclient's, responses decode to the same arrays, and the orjson response carries the same float32
values (and base64 bytes) as the plain-json path it replaced."""
from __future__ import annotations

import base64
import json

import numpy as np
from tritonclient.grpc import InferInput, service_pb2
from tritonclient.utils import serialize_byte_tensor

from gateway.routers.embeddings import EmbeddingsResponse, encode
from gateway.triton.engine import infer_input, infer_request, response_arrays, string_rows


def test_infer_request_matches_tritonclient_inputs():
    texts = ["plain", "Ünïcödé ✓", "", "x" * 1000]
    request = infer_request("text_embedding", {"text": string_rows(texts),
                                               "ids": np.arange(6, dtype=np.int64).reshape(2, 3)}, ["embedding"])
    assert request.model_name == "text_embedding" and [o.name for o in request.outputs] == ["embedding"]
    text, ids = request.inputs
    assert (text.name, text.datatype, list(text.shape)) == ("text", "BYTES", [4, 1])
    assert (ids.name, ids.datatype, list(ids.shape)) == ("ids", "INT64", [2, 3])
    reference: InferInput = infer_input("text", string_rows(texts))  # tritonclient's own serialization
    assert request.raw_input_contents[0] == reference._get_content()
    assert request.raw_input_contents[0] == serialize_byte_tensor(
        np.array([t.encode() for t in texts], dtype=np.object_)).item()
    assert np.array_equal(np.frombuffer(request.raw_input_contents[1], dtype=np.int64), np.arange(6))


def test_the_gateways_wait_goes_to_triton_as_the_requests_timeout():
    """The BLS fronts bound their generator calls by it (issue 48); none when the gateway gives none."""
    inputs = {"text": string_rows(["a"])}
    assert "timeout" not in infer_request("text_embedding", inputs, ["embedding"]).parameters
    request = infer_request("codegen", inputs, ["text_output"], timeout_s=2.5)
    assert request.parameters["timeout"].int64_param == 2_500_000


def test_response_arrays_decodes_numeric_and_bytes_outputs():
    vectors = np.random.default_rng(0).standard_normal((3, 384)).astype(np.float32)
    response = service_pb2.ModelInferResponse(model_name="m")
    for name, datatype, shape in (("embedding", "FP32", [3, 384]), ("label", "BYTES", [2])):
        tensor = response.outputs.add()
        tensor.name, tensor.datatype = name, datatype
        tensor.shape.extend(shape)
    response.raw_output_contents.append(vectors.tobytes())
    response.raw_output_contents.append(serialize_byte_tensor(np.array([b"a", b"bc"], dtype=np.object_)).item())
    out = response_arrays(response)
    assert out["embedding"].dtype == np.float32 and np.array_equal(out["embedding"], vectors)
    assert list(out["label"]) == [b"a", b"bc"]


def test_orjson_response_keeps_every_float32_and_base64_bytes():
    vectors = np.random.default_rng(1).standard_normal((2, 384)).astype(np.float32)
    sliced = vectors[:, :64]  # `dimensions` gives non-contiguous rows
    body = EmbeddingsResponse({"data": [{"embedding": encode(v, "float")} for v in sliced]}).body
    got = np.array([d["embedding"] for d in json.loads(body)["data"]], dtype=np.float32)
    assert np.array_equal(got, sliced)  # the shortest decimal of each float32 reads back as that float32
    b64 = encode(vectors[0], "base64")
    assert np.array_equal(np.frombuffer(base64.b64decode(b64), dtype="<f4"), vectors[0])
