"""Locust load test of the embedding gateway (the seeds load-test with Locust): POST /v1/embeddings
(one sentence, float or base64) and POST /infer (a few sentences; with a CLIP model also an image).

    make triton                                   # Triton + gateway on :8080
    .venv/bin/locust -f bench/locustfile_gateway.py --host http://localhost:8080 \\
        --headless -u 256 -r 32 -t 60s
    # images too: GATEWAY_CLIP_MODEL=demo_models/clip-demo (make triton preloads it)

GATEWAY_API_KEY or --api-key: the key to send (`Authorization: Bearer`). GATEWAY_MODEL picks the text model (default: the shipped all-MiniLM-L6-v2).
"""
from __future__ import annotations

import base64
import io
import os
import random

from locust import HttpUser, between, events, task

MODEL = os.environ.get("GATEWAY_MODEL", "sentence-transformers/all-MiniLM-L6-v2")
CLIP_MODEL = os.environ.get("GATEWAY_CLIP_MODEL", "")
WORDS = ("the a model server request batch token sentence embedding vector latency throughput queue worker "
         "python triton tensor inference pipeline encoder network memory cache quickly returns computes").split()


@events.init_command_line_parser.add_listener
def _api_key_option(parser):
    parser.add_argument("--api-key", default=os.environ.get("GATEWAY_API_KEY", ""),
                        help="the gateway's API key (default: $GATEWAY_API_KEY)")


def api_key(environment) -> str:
    options = getattr(environment, "parsed_options", None)
    return getattr(options, "api_key", "") or os.environ.get("GATEWAY_API_KEY", "")


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 40))).capitalize() + "."


def image_b64(rng: random.Random) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (rng.randint(32, 320), rng.randint(32, 320)),
              tuple(rng.randrange(256) for _ in range(3))).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


class GatewayUser(HttpUser):
    wait_time = between(0, 0.01)

    def on_start(self):
        self.rng = random.Random()
        if api_key(self.environment):
            self.client.headers["Authorization"] = f"Bearer {api_key(self.environment)}"
        if CLIP_MODEL:
            self.client.post("/load_clip_model", json={"model_name": CLIP_MODEL}, name="/load_clip_model")

    @task(8)
    def embeddings(self):
        fmt = self.rng.choice(("float", "base64"))
        with self.client.post("/v1/embeddings", json={"model": MODEL, "input": sentence(self.rng),
                                                      "encoding_format": fmt},
                              name=f"/v1/embeddings ({fmt})", catch_response=True) as r:
            if r.status_code == 200 and len(r.json()["data"]) != 1:
                r.failure("expected one embedding")

    @task(2)
    def infer_texts(self):
        texts = [sentence(self.rng) for _ in range(self.rng.randint(1, 8))]
        with self.client.post("/infer", json={"model_name": MODEL, "text": texts}, name="/infer (text)",
                              catch_response=True) as r:
            if r.status_code == 200 and len(r.json()["text_embeddings"]) != len(texts):
                r.failure("wrong number of embeddings")

    @task(1)
    def infer_image(self):
        if not CLIP_MODEL:
            return
        with self.client.post("/infer", json={"model_name": CLIP_MODEL, "text": [sentence(self.rng)],
                                              "image": [image_b64(self.rng)]},
                              name="/infer (clip text+image)", catch_response=True) as r:
            if r.status_code == 200 and len(r.json()["image_embeddings"]) != 1:
                r.failure("expected one image embedding")
