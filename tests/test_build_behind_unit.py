"""The first answer without waiting for the trainings (issue 57), without a server: the build's state files and
what the gateway makes of them (the 503 with Retry-After and progress, /v1/models' and /health's states), the
build going on past a pipeline whose training crashed, and the launcher's plan (which models wait)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

from build import build_models
from gateway.build_state import BUILDING, BUILT, FAILED, READY, BuildWatch, read, write_job, write_pipeline
from gateway.middleware.admission import Admission, Admit
from launcher.build_behind import load_order, pipeline_of
from launcher.paths import MODEL_REPOSITORY

PIPELINES = ["text_embedding", "ner", "codegen", "food_captioning", "embedding_demo"]


def test_a_pipeline_being_trained_reports_its_steps_and_the_time_left(tmp_path):
    write_pipeline(tmp_path, "food_captioning", state=BUILDING, phase="training", jobs=["train_blip", "train_food"])
    started = time.time() - 30
    write_job(tmp_path, "train_blip", 100, 400, started)
    write_job(tmp_path, "train_food", 100, 200, started + 10)
    write_job(tmp_path, "train_ner", 5, 10, started)  # another pipeline's: not counted
    (build,) = read(tmp_path).values()
    assert (build.pipeline, build.state, build.step, build.total) == ("food_captioning", BUILDING, 200, 600)
    # a third done in 30 s: about 60 s left
    assert 55 <= build.eta_s() <= 65 and 55 <= build.retry_after_s() <= 65
    body = build.as_json()
    assert body["progress"] == {"step": 200, "total": 600, "percent": 33.3} and 55 <= body["eta_s"] <= 65
    assert "(training: step 200 of 600, 33%, about 6" in build.describe() and "s left)" in build.describe()


def test_before_its_first_step_a_build_asks_for_a_retry_in_half_a_minute(tmp_path):
    write_pipeline(tmp_path, "ner", state=BUILDING, phase="waiting for training", jobs=["train_ner"])
    build = read(tmp_path)["ner"]
    assert build.eta_s() is None and build.retry_after_s() == 30 and "progress" not in build.as_json()


def test_the_gateway_refuses_only_the_routes_whose_pipeline_is_not_ready(tmp_path):
    write_pipeline(tmp_path, "ner", state=BUILDING, phase="training", jobs=[])
    write_pipeline(tmp_path, "codegen", state=FAILED, error="training train_codegen was killed by signal 9")
    write_pipeline(tmp_path, "food_captioning", state=READY)
    admission = Admission(builds=BuildWatch(tmp_path, every_s=0))
    ner, codegen = admission.building("/v1/ner"), admission.building("/v1/completions")
    assert ner.status == 503 and ner.code == "model_building" and ner.headers() == {"Retry-After": "30"}
    assert "'ner' is being built (training)" in ner.message
    assert codegen.code == "model_build_failed" and "killed by signal 9" in codegen.message
    assert admission.building("/v1/caption") is None and admission.building("/v1/embeddings") is None
    assert Admission().building("/v1/ner") is None  # no build folder: nothing is being built


def test_the_refusal_is_an_openai_error_with_retry_after_before_the_route_runs(tmp_path):
    write_pipeline(tmp_path, "ner", state=BUILDING, phase="training", jobs=[])
    reached, sent = [], []

    async def route(scope, receive, send):
        reached.append(scope["path"])

    async def send(message):
        sent.append(message)

    admit = Admit(route, Admission(builds=BuildWatch(tmp_path, every_s=0)))
    asyncio.run(admit({"type": "http", "path": "/v1/ner", "method": "POST"}, None, send))
    asyncio.run(admit({"type": "http", "path": "/v1/embeddings", "method": "POST"}, None, send))
    assert reached == ["/v1/embeddings"]
    start, body = sent
    assert start["status"] == 503 and (b"retry-after", b"30") in start["headers"]
    assert json.loads(body["body"])["error"]["code"] == "model_building"


def _trainer(module_name: str, retrain: bool, slot: int) -> None:
    """A spawned training: train_crash dies as a killed process would, the others finish."""
    if module_name == "train_crash":
        os.kill(os.getpid(), signal.SIGKILL)


def test_a_training_that_crashes_fails_its_pipeline_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(build_models, "TRAINED_BY", {"ner": ["train_crash"], "codegen": ["train_fine"]})
    built = []
    failures = build_models.build_all(["text_embedding", "ner", "codegen"], "demo",
                                      build_models.StateWriter(tmp_path), trainer=_trainer,
                                      builder=lambda pipeline, profile: built.append(pipeline),
                                      stale=["train_crash", "train_fine"])
    assert sorted(built) == ["codegen", "text_embedding"]
    assert failures == {"ner": "training train_crash was killed by signal 9"}
    states = read(tmp_path)
    # built, not ready: the launcher says `ready` once it has loaded them (the gateway waits for that)
    assert {name: b.state for name, b in states.items()} == {"text_embedding": BUILT, "ner": FAILED, "codegen": BUILT}
    assert "killed by signal 9" in states["ner"].error


def test_an_export_that_fails_fails_its_pipeline_alone(tmp_path):
    def builder(pipeline, profile):
        if pipeline == "ner":
            raise RuntimeError("ONNX differs from torch")
    failures = build_models.build_all(["text_embedding", "ner"], "demo", build_models.StateWriter(tmp_path),
                                      builder=builder, stale=[])
    assert failures == {"ner": "RuntimeError: ONNX differs from torch"}
    assert read(tmp_path)["text_embedding"].state == BUILT


def test_the_launcher_knows_each_models_pipeline_and_loads_steps_before_ensembles():
    assert pipeline_of("text_embedding_encoder", PIPELINES) == "text_embedding"
    assert pipeline_of("food_captioning", PIPELINES) == "food_captioning"
    assert pipeline_of("codegen_stream", PIPELINES) == "codegen" and pipeline_of("nerd", PIPELINES) is None
    models = ["ner", "ner_decoder", "ner_preprocess", "ner_tagger"]
    order = load_order(models, MODEL_REPOSITORY)
    assert order[-1] == "ner" and sorted(order) == models


def test_a_built_pipeline_is_ready_only_once_the_launcher_loaded_it(tmp_path, capsys):
    import subprocess

    from launcher.build_behind import BuildBehind

    write_pipeline(tmp_path, "ner", state=BUILT, phase="loading into the server")
    write_pipeline(tmp_path, "codegen", state=BUILT, phase="loading into the server")
    admission = Admission(builds=BuildWatch(tmp_path, every_s=0))
    assert admission.building("/v1/ner").code == "model_building", "built is not served yet"
    loads = {"ner": (None, "loaded 4 models into tritonserver: serving"),
             "codegen": ("unable to load codegen_generator", "loading it failed: unable to load codegen_generator")}
    watch = BuildBehind(["ner", "codegen"], "demo", tmp_path, tmp_path / "build.log", lambda p: loads[p])
    watch.process = subprocess.Popen(["true"])
    watch.process.wait()
    watch._watch()  # one look (the build has ended), then it returns
    states = read(tmp_path)
    assert (states["ner"].state, states["codegen"].state) == (READY, FAILED)
    assert states["codegen"].error == "unable to load codegen_generator"
    assert admission.building("/v1/ner") is None and admission.building("/v1/completions").code == "model_build_failed"
    out = capsys.readouterr().out
    assert "build: ner built; loaded 4 models" in out and "build: codegen FAILED: unable to load" in out


def test_the_demo_clip_built_behind_is_loaded_through_the_gateway_or_said_how(tmp_path, monkeypatch):
    import http.server
    import threading

    from launcher.build_behind import load_demo_clip
    from launcher.processes import free_port

    asked = []

    class Gateway(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            asked.append((self.path, self.headers.get("Authorization"),
                          json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass
    server = http.server.HTTPServer(("127.0.0.1", free_port()), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        monkeypatch.delenv("GATEWAY_API_KEYS_FILE", raising=False)
        assert "loaded the demo CLIP" in load_demo_clip(url, tmp_path / "none")
        monkeypatch.setenv("GATEWAY_API_KEYS_FILE", str(tmp_path / "keys"))
        (tmp_path / "admin").write_text("sk-admin\n")
        assert "loaded the demo CLIP" in load_demo_clip(url, tmp_path / "admin")
        assert asked == [("/load_clip_model", None, {"model_name": "demo_models/clip-demo"}),
                         ("/load_clip_model", "Bearer sk-admin", {"model_name": "demo_models/clip-demo"})]
        # the operator's own keys file: the launcher has no admin key, it says what to do
        assert "POST /load_clip_model" in load_demo_clip(url, tmp_path / "missing") and len(asked) == 2
    finally:
        server.shutdown()


def test_a_training_on_a_terminal_shows_one_live_line_and_in_a_log_plain_lines(tmp_path):
    import pty
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text("from build import common, train_progress\ntrain_progress.install()\n"
                      "log = common.TrainLog('toy', 40)\nfor i in range(40):\n    log.step(i, 0.5)\n")
    out = []

    def read(fd):
        data = os.read(fd, 4096)
        out.append(data)
        return data
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        pty.spawn(["bash", "-c", f"stty cols 100 rows 30; {sys.executable} {script}"], read)
    finally:
        os.environ.clear()
        os.environ.update(old)
    terminal = b"".join(out).decode(errors="replace")
    assert "toy: 100%" in terminal and "40/40" in terminal and "step 40/40" not in terminal, terminal[-500:]
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env).stdout
    assert "toy: step 40/40, loss 0.500" in plain and "%|" not in plain, plain
