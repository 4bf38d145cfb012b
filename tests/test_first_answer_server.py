"""Issue 57, live: `make triton`'s launcher (`python -m launcher --build-behind`) on a fresh model repository (the
shipped configs, no artifact), with an empty model cache ($XDG_CACHE_HOME) and an empty trained-model folder,
scaled down to text_embedding and ner (LOAD_MODELS) with ner's training held at its first step (BUILD_HOLD_FILE)
until the test has seen the wait. In order:
- embeddings serve (text_embedding was built first, then the server started);
- /v1/ner answers 503 with Retry-After and the training's progress, /v1/models and /health say `building`, and
  the /ui page shows it;
- released, ner trains, exports and is loaded into the running server: /v1/ner serves, from the same
  tritonserver process that answered the first embeddings;
- SIGTERM stops everything: the build, the server, the gateway."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import httpx
import pytest

from browser import local_browser
from launcher.paths import MODEL_REPOSITORY, ROOT
from launcher.processes import free_port
from supervisor.processes import alive, command_line, process_tree
from test_server_restart import wait_for

pytestmark = pytest.mark.integration
PIPELINES = ("text_embedding", "ner")


def fresh_repository(folder):
    """The shipped configs of the two pipelines' models, as a clone has them before `make model`."""
    models = []
    for config in sorted(MODEL_REPOSITORY.glob("*/config.pbtxt")):
        model = config.parent.name
        if model.startswith(PIPELINES):
            (folder / model / "1").mkdir(parents=True)
            shutil.copy(config, folder / model / "config.pbtxt")
            models.append(model)
    return models


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    folder = tmp_path_factory.mktemp("first-answer")
    repository = folder / "model_repository"
    models = fresh_repository(repository)
    hold = folder / "hold"
    hold.touch()
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port(), "gateway": free_port()}
    env = {**os.environ, "XDG_CACHE_HOME": str(folder / "cache"), "DEMO_TRAINED_DIR": str(folder / "trained"),
           "BUILD_HOLD_FILE": str(hold), "LOAD_MODELS": ",".join(models), "TRITON_DOMAINS": "encoders",
           "PRELOAD_MODELS": "", "MODEL_PROFILE": "demo", "HOST": "127.0.0.1", "PYTHONUNBUFFERED": "1"}
    env.pop("GATEWAY_API_KEYS_FILE", None)
    log = folder / "launcher.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "launcher", "--build-behind", "--model-repository", str(repository),
             "--data-dir", str(folder / "data"), "--http-port", str(ports["http"]), "--grpc-port", str(ports["grpc"]),
             "--metrics-port", str(ports["metrics"]), "--gateway-port", str(ports["gateway"])],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    http = httpx.Client(base_url=f"http://127.0.0.1:{ports['gateway']}", timeout=30)
    try:
        yield launcher, http, hold, ports, log, started, folder
    finally:
        http.close()
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGTERM)
            try:
                launcher.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait()


def answer(http, path, body):
    try:
        return http.post(path, json=body)
    except httpx.HTTPError:
        return None


def server_pid(launcher, grpc_port: int) -> int:
    flag = f"--grpc-port={grpc_port}"
    return next(pid for pid in process_tree(launcher.pid) if flag in (command_line(pid) or ()))


def test_embeddings_first_then_ner_joins_the_same_server(launched):
    launcher, http, hold, ports, log, started, folder = launched

    def embeds():
        assert launcher.poll() is None, log.read_text()[-3000:]
        r = answer(http, "/v1/embeddings", {"input": "first answer", "model": "sentence-transformers/all-MiniLM-L6-v2"})
        return r is not None and r.status_code == 200
    wait_for(embeds, 600, "no embeddings from the fresh repository", every=1.0)
    first_answer_s = time.monotonic() - started
    first_server = server_pid(launcher, ports["grpc"])

    def held():  # the training has written its first step: the wait's message carries the progress
        r = answer(http, "/v1/ner", {"text": "Ada Lovelace was born in London."})
        return r if r is not None and r.status_code == 503 and "step 0 of" in r.text else None
    waiting = wait_for(held, 600, "no 503 with the training's progress from /v1/ner", every=1.0)
    error = waiting.json()["error"]
    assert error["code"] == "model_building" and int(waiting.headers["retry-after"]) >= 5, waiting.text
    assert "'ner' is being built (training: step 0 of" in error["message"], error
    listed = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert listed["ner"]["state"] == "building" and listed["ner"]["progress"]["step"] == 0, listed
    assert listed["sentence-transformers/all-MiniLM-L6-v2"]["state"] == "ready"
    assert http.get("/v1/models/ner").json()["state"] == "building"
    health = http.get("/health")
    assert health.status_code == 200 and health.json()["builds"]["ner"]["state"] == "building", health.text
    with local_browser() as browser:
        page = browser.new_page()
        page.goto(f"{http.base_url}/ui")
        page.wait_for_selector("#builds:not([hidden])", timeout=30_000)
        assert "ner: training 0" in page.inner_text("#builds")
        page.close()

    hold.unlink()  # the training goes on, then the export, then the load into the running server

    def served():
        r = answer(http, "/v1/ner", {"text": "Ada Lovelace was born in London."})
        assert r is None or r.status_code in (200, 503), r.text
        return r if r is not None and r.status_code == 200 else None
    entities = wait_for(served, 900, "ner never served after its build", every=2.0).json()["entities"]
    assert {e["text"] for e in entities} & {"Ada Lovelace", "London"}, entities
    assert server_pid(launcher, ports["grpc"]) == first_server, "the server was restarted to load ner"
    assert "build: ner built; loaded 4 models into tritonserver: serving" in log.read_text()
    assert "ner" not in {m["id"] for m in http.get("/v1/models").json()["data"]}
    print(f"\nfirst embeddings {first_answer_s:.0f}s after the launcher started (fresh repository, empty cache)")

    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(120) == 0, log.read_text()[-3000:]
    left = [p for p in process_tree(os.getpid()) if str(folder) in " ".join(command_line(p) or ())]
    assert not left and not alive(first_server), left
