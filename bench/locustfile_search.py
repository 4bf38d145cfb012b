"""Locust load test of image search: each user indexes generated images into one shared collection
(POST /collections/NAME/points, a few per request) and searches it by image, by text and by vector.

    make triton                                   # Triton + gateway on :8080
    .venv/bin/locust -f bench/locustfile_search.py --host http://localhost:8080 \\
        --headless -u 16 -r 4 -t 60s

SEARCH_COLLECTION (default locust-search), SEARCH_STORE (faiss | qdrant), SEARCH_MODEL (default the
demo CLIP, loaded by the first user). GATEWAY_API_KEY or --api-key: an admin key (it loads a model and
writes points).
"""
from __future__ import annotations

import base64
import os
import random

from locust import HttpUser, between, events, task

from client.search import demo_image, encode

COLLECTION = os.environ.get("SEARCH_COLLECTION", "locust-search")
STORE = os.environ.get("SEARCH_STORE", "faiss")
MODEL = os.environ.get("SEARCH_MODEL", "demo_models/clip-demo")
IMAGES = [base64.b64encode(encode(demo_image(i))).decode() for i in range(400)]
WORDS = "red green blue striped checked dotted circle gradient plain pattern bright dark".split()


@events.init_command_line_parser.add_listener
def _api_key_option(parser):
    parser.add_argument("--api-key", default=os.environ.get("GATEWAY_API_KEY", ""),
                        help="the gateway's API key, an admin one here (default: $GATEWAY_API_KEY)")


def api_key_headers(environment) -> dict[str, str]:
    options = getattr(environment, "parsed_options", None)
    key = getattr(options, "api_key", "") or os.environ.get("GATEWAY_API_KEY", "")
    return {"Authorization": f"Bearer {key}"} if key else {}


@events.test_start.add_listener
def create_collection(environment, **_):
    import httpx

    with httpx.Client(base_url=environment.host, timeout=600, headers=api_key_headers(environment)) as http:
        http.post("/load_clip_model", json={"model_name": MODEL}).raise_for_status()
        http.put(f"/collections/{COLLECTION}", json={"model": MODEL, "store": STORE}).raise_for_status()


class SearchUser(HttpUser):
    wait_time = between(0, 0.01)

    def on_start(self):
        self.rng = random.Random()
        self.client.headers.update(api_key_headers(self.environment))
        self.dimension = self.client.get(f"/collections/{COLLECTION}", name="/collections/[name]").json()["dimension"]

    @task(2)
    def index(self):
        picks = self.rng.sample(range(len(IMAGES)), self.rng.randint(1, 8))
        points = [{"id": f"img-{i}", "image": IMAGES[i], "payload": {"pattern": i % 8}} for i in picks]
        self.client.post(f"/collections/{COLLECTION}/points", json={"points": points},
                         name="/collections/[name]/points")

    def _search(self, body: dict, label: str) -> None:
        with self.client.post(f"/collections/{COLLECTION}/search", json={**body, "limit": 10},
                              name=f"/collections/[name]/search ({label})", catch_response=True) as r:
            if r.status_code == 200 and "results" not in r.json():
                r.failure("no results field")

    @task(4)
    def by_image(self):
        self._search({"image": IMAGES[self.rng.randrange(len(IMAGES))]}, "image")

    @task(2)
    def by_text(self):
        self._search({"text": " ".join(self.rng.sample(WORDS, 3))}, "text")

    @task(4)
    def by_vector(self):
        self._search({"vector": [self.rng.gauss(0, 1) for _ in range(self.dimension)]}, "vector")

    @task(1)
    def filtered(self):
        self._search({"image": IMAGES[self.rng.randrange(len(IMAGES))], "filter": {"pattern": self.rng.randrange(8)}},
                     "image+filter")
