"""A runtime load by hub id through a live gateway, against tests/fake_hub.py (HF_ENDPOINT), never the
real hub: the model is downloaded once however many clients ask, generated and exported like a local
folder, and serves the same embeddings as the same files loaded from a folder under MODEL_ROOTS; the
allowlist and a missing model answer with their own status and code in OpenAI's error shape.

The gateway here is one of its own (HUB_DOWNLOADS=fake-org) beside the session's Triton: its DATA_DIR
is fresh, but its generated models go into the Triton repository of the session (a symlink) and it
shares the session's ONNX cache."""
from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from fake_hub import FakeHub
from gateway_helpers import CLIP_DEMO, ST_CLS_DEMO
from model_configs import ROOT

pytestmark = pytest.mark.integration
HUB_ID, LOCAL = "fake-org/st-cls-demo", "hub-test-copy/st-cls-demo"
OPEN_CLIP_REPO = "laion/CLIP-ViT-B-32-laion2B-s34B-b79K"
TEXTS = ["A man is eating food.", "  The girl is carrying a baby.  ", "Ünïcödé text!?", "x " * 300]


@pytest.fixture(scope="module")
def hub_gateway(triton, data_dir, tmp_path_factory):
    from gateway.settings import default_model_roots
    from launcher.gateway_process import GatewayProcess
    from launcher.processes import free_port

    own = tmp_path_factory.mktemp("hub_gateway")
    (data_dir / "triton_models").mkdir(parents=True, exist_ok=True)
    (own / "data").mkdir()
    (own / "data" / "triton_models").symlink_to(data_dir / "triton_models", target_is_directory=True)
    models = own / "models"
    shutil.copytree(ROOT / ST_CLS_DEMO, models / LOCAL)
    with FakeHub() as fake:
        fake.add(HUB_ID, ROOT / ST_CLS_DEMO)
        fake.add("fake-org/clip-demo", ROOT / CLIP_DEMO)
        fake.add("other-org/st-cls-demo", ROOT / ST_CLS_DEMO)
        fake.add(OPEN_CLIP_REPO, ROOT / CLIP_DEMO)  # where the open_clip table sends ViT-B-32 + laion2b_s34b_b79k
        fake.throttle_s = 0.001  # the download lasts while the second client asks
        roots = [*default_model_roots(), models]
        process = GatewayProcess(triton.grpc_url, port=free_port(), data_dir=own / "data", log_file=own / "gateway.log",
                                 env={"HF_ENDPOINT": fake.url, "HUB_DOWNLOADS": "fake-org,laion", "PRELOAD_MODELS": "",
                                      "ONNX_CACHE_DIR": str(data_dir / "onnx_cache"),
                                      "MODEL_ROOTS": os.pathsep.join(str(r) for r in roots)})
        import httpx

        process.start(timeout=180)
        client = httpx.Client(base_url=process.url, timeout=600)
        try:
            yield client, fake, own
        finally:
            for name, pretrained in ((HUB_ID, None), (LOCAL, None), ("ViT-B-32", "laion2b_s34b_b79k")):
                client.post("/unload_model", json={"model_name": name, "pretrained": pretrained})
            client.close()
            process.stop()


def embeddings(client, model: str) -> np.ndarray:
    r = client.post("/v1/embeddings", json={"model": model, "input": TEXTS, "truncate": True})  # "x " * 300: cut
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


def test_a_load_by_hub_id_downloads_once_and_serves_what_the_folder_serves(hub_gateway):
    client, fake, own = hub_gateway
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: client.post("/load_sentence_transformer_model",
                                                      json={"model_name": HUB_ID}), range(2)))
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    assert fake.downloads(HUB_ID, "model.safetensors") == 1
    assert list((own / "data" / "hub_cache").glob("models--fake-org--st-cls-demo/snapshots/*/model.safetensors"))
    r = client.post("/load_sentence_transformer_model", json={"model_name": LOCAL})
    assert r.status_code == 200, r.text
    hub_model, local_model = answers[0].json()["model"], r.json()["model"]
    assert hub_model["dimension"] == local_model["dimension"]
    assert np.allclose(embeddings(client, HUB_ID), embeddings(client, LOCAL), atol=1e-6)
    log = (own / "gateway.log").read_text(errors="replace")
    assert "hub download fake-org/st-cls-demo" in log and "done" in log, "progress is in the log"


@pytest.mark.parametrize("name,status,code,words", [
    ("other-org/st-cls-demo", 403, "hub_model_not_allowed", ["HUB_DOWNLOADS=fake-org,laion", "other-org"]),
    ("fake-org/no-such-model", 404, "model_not_found", ["does not exist"]),
    ("fake-org/clip-demo", 422, "unsupported_model", ["not a sentence-transformers model"])])
def test_refusals_through_the_gateway(hub_gateway, name, status, code, words):
    client, fake, _ = hub_gateway
    r = client.post("/load_sentence_transformer_model", json={"model_name": name})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code and error["param"] == "model_name"
    assert all(w in error["message"] for w in words), error["message"]
    assert fake.downloads(name, "model.safetensors") == 0


def test_the_seeds_clip_example_loads_through_the_open_clip_table(hub_gateway):
    """POST /load_clip_model {"model_name": "ViT-B-32", "pretrained": "laion2b_s34b_b79k"}: the repository the
    table names is downloaded (here: the demo CLIP's files) and serves CLIPModel's text and image features."""
    from gateway_helpers import clip_image_features, clip_text_features, png_bytes, b64

    client, fake, _ = hub_gateway
    r = client.post("/load_clip_model", json={"model_name": "ViT-B-32", "pretrained": "laion2b_s34b_b79k"})
    assert r.status_code == 200, r.text
    assert fake.downloads(OPEN_CLIP_REPO, "model.safetensors") == 1
    texts, images = ["a photo of a cat", "stripes"], [png_bytes((64, 48), (10, 200, 10), pattern=2)]
    r = client.post("/infer", json={"model_name": "ViT-B-32", "pretrained": "laion2b_s34b_b79k", "text": texts,
                                    "image": [b64(i) for i in images]})
    assert r.status_code == 200, r.text
    body = r.json()
    np.testing.assert_allclose(np.array(body["text_embeddings"]), clip_text_features(texts), atol=1e-5)
    np.testing.assert_allclose(np.array(body["image_embeddings"]), clip_image_features(images), atol=1e-5)
