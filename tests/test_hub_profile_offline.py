"""The hub profile proven without a network: `make model MODEL_PROFILE=hub` (build/build_models.py --profile
hub, into a temporary model repository so the demo artifacts stay as they are) reads a local Hugging Face
cache laid out like the real repositories (tests/hub_layouts.py, small weights; what the real ones hold:
docs/hub-layouts.md) with HF_HUB_OFFLINE=1 and HF_ENDPOINT at a closed port. Every pipeline it built is
then served by its own tritonserver (free ports, always stopped), and its outputs equal the reference
libraries' (sentence-transformers, flair, transformers) on the same weights loaded by the same hub ids
(tests/hub_reference.py, a child process with the cache's environment)."""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from food_images import mixed_images
from model_configs import MODEL_REPOSITORY, ROOT
from string_tensors import string_rows

pytestmark = pytest.mark.integration

PIPELINES = ["text_embedding", "ner", "codegen", "food_captioning"]  # embedding_demo builds demo models only
TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "", "Ünïcödé naïve café", "x " * 300]
NER_TEXTS = ["George Washington went to Washington.", "Angela Merkel met Emmanuel Macron in Paris.",
             "Apple Inc. is based in Cupertino, California.", "I like bread.", "x",
             "First sentence about London. Second one about Paris! Third about Rome?"]
IMAGE_NAMES = ["rgb.jpg", "one_pixel.png", "grey.jpg", "rgba.png", "photo.webp", "wide.jpg"]
PROMPTS = ["def fibonacci(n):", "import os\n", "class Stack:\n    def push(self, item):\n        "]
MAX_TOKENS = 24
TIMEOUT = 300


def hub_env(cache_env: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "FLAIR_"))}
    env.update(cache_env)  # HF_HUB_OFFLINE=1, HF_ENDPOINT=http://127.0.0.1:9, the caches, FOOD11_CLASSIFIER
    return env


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The cache, the hub build into a copy of model_repository/'s configs, and the references."""
    from hub_layouts import build_cache

    root = tmp_path_factory.mktemp("hub_profile")
    env = hub_env(build_cache(root / "cache"))
    assert env["HF_HUB_OFFLINE"] == "1" and env["HF_ENDPOINT"] == "http://127.0.0.1:9"
    repository = root / "model_repository"
    for config in sorted(MODEL_REPOSITORY.glob("*/config.pbtxt")):
        (repository / config.parent.name / "1").mkdir(parents=True)
        shutil.copyfile(config, repository / config.parent.name / "config.pbtxt")
    demo_before = {p: p.stat().st_mtime_ns for p in MODEL_REPOSITORY.glob("*/1/*")}
    done = subprocess.run([sys.executable, str(ROOT / "build" / "build_models.py"), "--profile", "hub",
                           "--repository", str(repository), *PIPELINES],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"profile hub, into {repository}/" in done.stdout
    assert {p: p.stat().st_mtime_ns for p in MODEL_REPOSITORY.glob("*/1/*")} == demo_before, \
        "the hub build touched model_repository/"

    images = mixed_images()
    inputs = {"texts": TEXTS, "ner_texts": NER_TEXTS, "prompts": PROMPTS, "max_tokens": MAX_TOKENS,
              "images": [base64.b64encode(images[n]).decode() for n in IMAGE_NAMES]}
    (root / "inputs.json").write_text(json.dumps(inputs))
    ref = subprocess.run([sys.executable, str(ROOT / "tests" / "hub_reference.py"), str(root / "inputs.json"),
                          str(root / "outputs.json")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    return repository, json.loads((root / "outputs.json").read_text()), {n: images[n] for n in IMAGE_NAMES}


@pytest.fixture(scope="module")
def server(built, tmp_path_factory):
    from launcher.processes import free_port
    from launcher.triton_server import TritonServer

    from codegen_engines import pin_exact

    repository = built[0]
    generator = repository / "codegen_generator" / "config.pbtxt"  # f32: its tokens are held to transformers'
    generator.write_text(pin_exact(generator.read_text()))
    models = sorted(p.parent.name for p in repository.glob("*/config.pbtxt"))
    log = tmp_path_factory.mktemp("hub_triton") / "tritonserver.log"
    triton = TritonServer(model_repository=repository, http_port=free_port(), grpc_port=free_port(),
                          metrics_port=free_port(), explicit_models=models, log_file=log)
    triton.start(timeout=600)
    try:
        yield triton
    finally:
        triton.stop()


def client(server):
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(server.grpc_url)


def test_the_build_used_the_hub_files(built):
    """What the hub build wrote came from the cache's repositories (not from the demo's sources)."""
    repository = built[0]
    generator = json.loads((repository / "codegen_generator" / "1" / "config.json").read_text())
    assert (generator["n_embd"], generator["n_layer"], generator["vocab_size"]) == (64, 2, 51200)
    tokenizer = json.loads((repository / "codegen_generator" / "1" / "tokenizer.json").read_text())
    eos = tokenizer["model"]["vocab"]["<|endoftext|>"]
    assert generator["eos_token_id"] == eos != 2, "moyix's eos_token_id 2 must be replaced by <|endoftext|>"
    ir = repository / "codegen_generator" / "1" / "openvino"  # what the served generator runs (engine: auto on CPU)
    assert json.loads((ir / "config.json").read_text())["n_embd"] == 64 and (ir / "openvino_model.xml").exists()
    assert json.loads((ir / "export.json").read_text())["weights"] == "fp32"
    captioner = json.loads((repository / "food_captioning_captioner" / "1" / "config.json").read_text())
    assert captioner["text_config"]["vocab_size"] == 30524 and captioner["vision_config"]["image_size"] == 384
    classifier = json.loads((repository / "food_captioning_classifier" / "1" / "config.json").read_text())
    assert classifier["model_type"] == "vit" and classifier["id2label"]["0"] == "Bread"
    tagger = json.loads((repository / "ner_tagger" / "1" / "tagger_config.json").read_text())
    assert [lm["hidden_size"] for lm in tagger["char_lms"]] == [64, 64] and tagger["hidden_size"] == 32


def test_text_embedding_equals_sentence_transformers(server, built):
    got = client(server).infer("text_embedding", [string_rows("text", TEXTS)]).as_numpy("embedding")
    np.testing.assert_allclose(got, np.array(built[1]["embeddings"], dtype=np.float32), atol=1e-5)


def test_ner_equals_flair_predict(server, built):
    rows = client(server).infer("ner", [string_rows("text", NER_TEXTS)]).as_numpy("entities").reshape(-1)
    served = [json.loads(v.decode()) for v in rows]
    expected = built[1]["entities"]
    assert sum(len(row) for row in expected) >= 3, "the random tagger should find some entities"
    for text, entities, spans in zip(NER_TEXTS, served, expected):
        assert [(e["start"], e["end"], e["label"]) for e in entities] == [tuple(s[:3]) for s in spans], text
        for e, span in zip(entities, spans):
            assert abs(e["score"] - span[3]) < 1e-4, (text, e, span)


def test_food_captioning_equals_the_classifier_and_blip_generate(server, built):
    images = built[2]
    result = client(server).infer("food_captioning", [string_rows("image", [images[n] for n in IMAGE_NAMES])])
    labels = [v.decode() for v in result.as_numpy("label")[:, 0]]
    scores = result.as_numpy("score")[:, 0]
    captions = [v.decode() for v in result.as_numpy("caption")[:, 0]]
    for name, label, score, caption, (want_label, want_score, want_caption) in zip(
            IMAGE_NAMES, labels, scores, captions, built[1]["captions"]):
        assert label == want_label, name
        assert abs(float(score) - want_score) < 1e-5, name
        assert caption == want_caption, (name, caption, want_caption)
    assert all(c.startswith("a photo of ") for c in captions), captions


def test_codegen_unary_and_stream_equal_transformers_generate(server, built):
    import queue

    import tritonclient.grpc as grpcclient

    def inputs(prompt):
        text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[prompt.encode()]], dtype=np.object_))
        limit = grpcclient.InferInput("max_tokens", [1, 1], "INT32")
        limit.set_data_from_numpy(np.array([[MAX_TOKENS]], dtype=np.int32))
        healing = grpcclient.InferInput("token_healing", [1, 1], "BOOL")  # off: the prompt's ids as transformers'
        healing.set_data_from_numpy(np.array([[False]]))
        return [text, limit, healing]

    expected = built[1]["completions"]
    assert any(expected), "the random GPT-J should continue some prompt"
    for prompt, want in zip(PROMPTS, expected):
        got = client(server).infer("codegen", inputs(prompt), client_timeout=TIMEOUT).as_numpy("text_output")
        assert got.reshape(-1)[0].decode() == want, prompt
        events: queue.Queue = queue.Queue()
        stream = client(server)
        stream.start_stream(callback=lambda result, error: events.put((result, error)))
        try:
            stream.async_stream_infer("codegen_stream", inputs(prompt), enable_empty_final_response=True)
            pieces = []
            while True:
                result, error = events.get(timeout=TIMEOUT)
                assert error is None, error
                response = result.get_response()
                if response.outputs:
                    pieces.append(result.as_numpy("text_output").reshape(-1)[0])
                if response.parameters["triton_final_response"].bool_param:
                    break
        finally:
            stream.stop_stream()
        assert b"".join(pieces).decode() == want, prompt
