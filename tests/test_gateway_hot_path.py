"""The gateway's /v1/embeddings hot path without a server: the ModelInfer message built by hand equals
tritonclient's, responses decode to the same arrays, and the orjson response carries the same float32
values (and base64 bytes) as the plain-json path it replaced."""
from __future__ import annotations

import base64
import json

import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.utils import serialize_byte_tensor

from gateway.routers.embeddings import EmbeddingsResponse, encode
from gateway.triton.engine import infer_request, response_arrays, stream_request, string_rows


def test_infer_request_matches_tritonclient_inputs():
    texts = ["plain", "Ünïcödé ✓", "", "x" * 1000]
    request = infer_request("text_embedding", {"text": string_rows(texts),
                                               "ids": np.arange(6, dtype=np.int64).reshape(2, 3)}, ["embedding"])
    assert request.model_name == "text_embedding" and [o.name for o in request.outputs] == ["embedding"]
    text, ids = request.inputs
    assert (text.name, text.datatype, list(text.shape)) == ("text", "BYTES", [4, 1])
    assert (ids.name, ids.datatype, list(ids.shape)) == ("ids", "INT64", [2, 3])
    assert request.raw_input_contents[0] == serialize_byte_tensor(  # tritonclient's own serialization
        np.array([t.encode() for t in texts], dtype=np.object_)).item()
    assert np.array_equal(np.frombuffer(request.raw_input_contents[1], dtype=np.int64), np.arange(6))


def test_the_gateways_wait_goes_to_triton_as_the_requests_timeout():
    """The BLS fronts bound their generator calls by it (issue 48); none when the gateway gives none."""
    inputs = {"text": string_rows(["a"])}
    assert "timeout" not in infer_request("text_embedding", inputs, ["embedding"]).parameters
    request = infer_request("codegen", inputs, ["text_output"], timeout_s=2.5)
    assert request.parameters["timeout"].int64_param == 2_500_000


def test_str_and_bytes_arrays_go_as_bytes_like_object_arrays():
    texts = ["plain", "Ünïcödé ✓"]
    reference = infer_request("m", {"text": string_rows(texts)}, [])
    for array in (np.array([[t] for t in texts]), np.array([[t.encode()] for t in texts])):  # <U and |S dtypes
        request = infer_request("m", {"text": array}, [])
        assert request.inputs[0].datatype == "BYTES" and request.raw_input_contents == reference.raw_input_contents


def test_a_stream_request_asks_every_output_and_a_final_flag_even_when_empty():
    inputs = {"text_input": string_rows(["def f("]), "max_tokens": np.array([[8]], dtype=np.int32),
              "exclude_input_in_output": np.array([[False]])}
    request = stream_request("codegen_stream", inputs, timeout_s=2.5)
    assert request.model_name == "codegen_stream" and not request.outputs  # no output named: Triton sends all
    assert request.parameters["triton_enable_empty_final_response"].bool_param
    assert request.parameters["timeout"].int64_param == 2_500_000
    assert [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == [
        ("text_input", "BYTES", [1, 1]), ("max_tokens", "INT32", [1, 1]), ("exclude_input_in_output", "BOOL", [1, 1])]
    assert request.raw_input_contents[1:] == [np.int32(8).tobytes(), b"\x00"]


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
