"""Every pipeline answers every non-empty subset of its outputs, over gRPC and over HTTP/JSON (KServe v2
`outputs`), with the same values as a call that names no outputs. Triton prunes the ensemble steps whose
outputs nobody asked for; an ensemble output that also feeds a step once made food_captioning deadlock
on a single requested output (its config says how the pipeline avoids it).

codegen_stream is decoupled: Triton serves it over gRPC streaming only (KServe HTTP `infer` refuses
decoupled models), so its subsets go over `stream_infer`, and over HTTP its `generate_stream` endpoint,
which always carries every output, is checked against the gRPC stream."""
from __future__ import annotations

import io
import itertools
import json
import queue
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from PIL import Image

from gateway.modelgen import generate, resolve_source
from gateway.settings import default_model_roots
from gateway_helpers import CLIP_DEMO, minilm_path, png_bytes

pytestmark = pytest.mark.integration
TIMEOUT = 300


def _png(colour=(200, 60, 30), size=(224, 224)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, "PNG")
    return buffer.getvalue()


# pipeline -> (its outputs, its inputs as (name, numpy array, Triton dtype, JSON-safe))
PIPELINES = {
    "text_embedding": (["embedding"], [("text", np.array([[b"A man is eating food."], [b"x"]], dtype=object),
                                        "BYTES", True)]),
    "ner": (["entities"], [("text", np.array([[b"George Washington went to Washington."]], dtype=object),
                            "BYTES", True)]),
    "food_captioning": (["label", "score", "caption"],
                        [("image", np.array([[_png()], [_png((20, 120, 220), (96, 64))]], dtype=object),
                          "BYTES", False)]),
    "codegen": (["text_output", "finish_reason", "prompt_tokens", "completion_tokens"],
                [("text_input", np.array([[b"def fibonacci(n):"], [b"import os\n"]], dtype=object), "BYTES", True),
                 ("max_tokens", np.array([[8], [8]], dtype=np.int32), "INT32", True)]),
}


def subsets(names: list[str]) -> list[tuple[str, ...]]:
    return [s for k in range(1, len(names) + 1) for s in itertools.combinations(names, k)]


def grpc_infer(url: str, model: str, inputs, outputs) -> dict[str, np.ndarray]:
    client = grpcclient.InferenceServerClient(url)
    tensors = []
    for name, array, dtype, _ in inputs:
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    requested = [grpcclient.InferRequestedOutput(o) for o in outputs] if outputs else None
    result = client.infer(model, tensors, outputs=requested, client_timeout=TIMEOUT)
    return {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}


def http_infer(url: str, model: str, inputs, outputs) -> dict[str, np.ndarray]:
    """JSON for every tensor that JSON can hold (images stay binary); outputs as JSON."""
    client = httpclient.InferenceServerClient(url, network_timeout=TIMEOUT, connection_timeout=TIMEOUT)
    tensors = []
    for name, array, dtype, json_safe in inputs:
        tensor = httpclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array, binary_data=not json_safe)
        tensors.append(tensor)
    requested = [httpclient.InferRequestedOutput(o, binary_data=False) for o in outputs] if outputs else None
    result = client.infer(model, tensors, outputs=requested)
    return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}


def _bytes(value) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)  # JSON outputs come back as str


def assert_same(got: dict[str, np.ndarray], expected: dict[str, np.ndarray], names) -> None:
    assert set(got) == set(names)
    for name in names:
        if expected[name].dtype == np.object_:
            assert [_bytes(v) for v in got[name].reshape(-1)] == [_bytes(v) for v in expected[name].reshape(-1)], name
        else:
            np.testing.assert_allclose(got[name], expected[name], rtol=0, atol=1e-6, err_msg=name)


@pytest.fixture(scope="module")
def server(triton):
    triton.load("codegen_generator", *PIPELINES, "codegen_stream")  # codegen's BLS step calls the generator
    return triton


@pytest.fixture(scope="module")
def all_outputs(server) -> dict[str, dict[str, np.ndarray]]:
    return {model: grpc_infer(server.grpc_url, model, inputs, None) for model, (_, inputs) in PIPELINES.items()}


CASES = [(model, subset) for model, (names, _) in PIPELINES.items() for subset in subsets(names)]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("model,outputs", CASES, ids=[f"{m}-{'+'.join(s)}" for m, s in CASES])
def test_every_output_subset_answers_with_the_values_of_a_full_call(server, all_outputs, model, outputs, protocol):
    names, inputs = PIPELINES[model]
    assert set(all_outputs[model]) == set(names)
    call = grpc_infer if protocol == "grpc" else http_infer
    got = call(server.grpc_url if protocol == "grpc" else server.http_url, model, inputs, list(outputs))
    assert_same(got, all_outputs[model], outputs)


# --- codegen_stream -------------------------------------------------------------------------------
STREAM_OUTPUTS = ["text_output", "finish_reason", "prompt_tokens", "completion_tokens"]


def stream(url: str, outputs) -> list[dict[str, np.ndarray]]:
    """Every response of one greedy 8-token codegen_stream request (the empty final one included)."""
    client = grpcclient.InferenceServerClient(url)
    events: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    try:
        tensors = []
        for name, array, dtype, _ in PIPELINES["codegen"][1]:
            tensor = grpcclient.InferInput(name, [1, *array.shape[1:]], dtype)
            tensor.set_data_from_numpy(array[:1])
            tensors.append(tensor)
        client.async_stream_infer("codegen_stream", tensors, enable_empty_final_response=True,
                                  outputs=[grpcclient.InferRequestedOutput(o) for o in outputs] if outputs else None)
        responses = []
        while True:
            result, error = events.get(timeout=TIMEOUT)
            if error is not None:
                raise error
            response = result.get_response()
            responses.append({o.name: result.as_numpy(o.name) for o in response.outputs})
            if response.parameters["triton_final_response"].bool_param:
                return responses
    finally:
        client.stop_stream()


def summary(responses: list[dict[str, np.ndarray]], outputs) -> dict:
    """What a stream says, independent of how its tokens were grouped into responses (that depends on
    timing): the whole text, the finish reasons given, the prompt's token count, the final token count."""
    pieces = [r for r in responses if r]
    assert all(set(r) == set(outputs) for r in pieces), [sorted(r) for r in pieces]
    assert not responses[-1] or len(pieces) == len(responses)  # a bare final response, or a final piece
    said: dict = {}
    if "text_output" in outputs:
        said["text"] = b"".join(_bytes(r["text_output"].reshape(-1)[0]) for r in pieces)
    if "finish_reason" in outputs:
        said["finish_reasons"] = [v for r in pieces if (v := _bytes(r["finish_reason"].reshape(-1)[0]))]
    if "prompt_tokens" in outputs:
        said["prompt_tokens"] = {int(r["prompt_tokens"].reshape(-1)[0]) for r in pieces}
    if "completion_tokens" in outputs:
        counts = [int(r["completion_tokens"].reshape(-1)[0]) for r in pieces]
        assert counts == sorted(counts)
        said["completion_tokens"] = counts[-1]
    return said


@pytest.fixture(scope="module")
def full_stream(server) -> dict:
    said = summary(stream(server.grpc_url, None), STREAM_OUTPUTS)
    assert said["text"] and said["finish_reasons"] in ([b"length"], [b"stop"]) and len(said["prompt_tokens"]) == 1
    return said


@pytest.mark.parametrize("outputs", subsets(STREAM_OUTPUTS), ids="+".join)
def test_every_output_subset_of_the_stream_carries_the_same_values(server, full_stream, outputs):
    said = summary(stream(server.grpc_url, list(outputs)), outputs)
    assert said == {k: v for k, v in full_stream.items() if k in said}
    assert len(said) == len(outputs)


def test_the_stream_over_http_generate_stream_equals_the_grpc_stream(server, full_stream):
    body = json.dumps({"text_input": "def fibonacci(n):", "max_tokens": 8}).encode()
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/codegen_stream/generate_stream", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
        events = [json.loads(line[len(b"data: "):]) for line in response.read().splitlines() if line.startswith(b"data: ")]
    responses = [{name: np.array([[event[name]]], dtype=object if isinstance(event[name], str) else np.int32)
                  for name in STREAM_OUTPUTS} for event in events]
    assert summary(responses, STREAM_OUTPUTS) == full_stream


# --- the gateway's generated ensembles (one of each kind) -------------------------------------------
@pytest.fixture(scope="module")
def generated(server, data_dir) -> dict[str, tuple[str, np.ndarray, bool]]:
    """ensemble -> (input name, rows, JSON-safe) for a sentence-transformers model and a CLIP (text and
    image ensembles). Names of their own (./...) so they never collide with the gateway tests' models."""
    roots = default_model_roots()
    st = generate("./subsets-minilm", None, "sentence_transformer",
                  resolve_source(minilm_path(), None, "sentence_transformer", roots), data_dir / "triton_models")
    clip = generate("./subsets-clip", None, "clip", resolve_source(CLIP_DEMO, None, "clip", roots),
                    data_dir / "triton_models")
    server.load(*st.ensembles, *clip.ensembles)
    texts = np.array([[b"a red square on a blue background"], [b"stripes"]], dtype=object)
    images = np.array([[png_bytes((80, 60), (200, 30, 30))], [png_bytes((64, 64), (10, 200, 10), pattern=2)]],
                      dtype=object)
    cases = {st.ensembles[0]: ("text", texts, True)}
    for ensemble in clip.ensembles:
        cases[ensemble] = ("image", images, False) if "image" in ensemble else ("text", texts, True)
    return cases


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_generated_ensembles_answer_their_output_by_name(server, generated, protocol):
    assert len(generated) == 3
    for ensemble, (input_name, rows, json_safe) in generated.items():
        inputs = [(input_name, rows, "BYTES", json_safe)]
        full = grpc_infer(server.grpc_url, ensemble, inputs, None)
        assert set(full) == {"embedding"}, ensemble
        call = grpc_infer if protocol == "grpc" else http_infer
        got = call(server.grpc_url if protocol == "grpc" else server.http_url, ensemble, inputs, ["embedding"])
        assert_same(got, full, ["embedding"])
