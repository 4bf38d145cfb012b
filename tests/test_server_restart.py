"""kill -9 of tritonserver under `make triton`'s launcher, under load from 8 gateway clients, in both
topologies (the launcher starting the gateway; the launcher with --no-gateway and the gateway as a
process of its own, as in the Kustomize pod):

- the launcher reaps the dead server's stubs and /dev/shm regions and starts it again;
- the gateway stays up: clients get only 200 or 503 (with Retry-After), never a 500, a hang or a refused
  connection; /health is 503 naming the server, then 200;
- the gateway loads its runtime model and the preloaded demo CLIP into the new server (the registry
  re-sync); /loaded_models never lists a model that is not served, and lists it again once it is;
- every shipped pipeline and the runtime model serve again; nothing is left after the stop.

The figures (start-up, model loads, re-sync, total) are printed: `pytest -s` shows them."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import httpx
import pytest

from bench.workload import pipelines
from launcher.gateway_process import GatewayProcess
from launcher.paths import ROOT
from launcher.processes import free_port
from supervisor.codegen_probe import stream_call
from supervisor.processes import process_tree, shm_regions_mapped
from test_supervisor_launcher import running, tritonserver_pid

pytestmark = pytest.mark.integration
ST_DEMO = "demo_models/st-cls-demo"
CLIP = "demo_models/clip-demo"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass
class Call:
    kind: str
    start: float
    end: float
    status: int | None  # None: no HTTP answer (connection refused, timeout)
    detail: str = ""


def request(http: httpx.Client, kind: str) -> httpx.Response:
    if kind == "completions":
        return http.post("/v1/completions", json={"model": "codegen", "prompt": "def add(a, b):", "max_tokens": 4})
    model = {"minilm": MINILM, "runtime": ST_DEMO, "clip": CLIP}[kind]
    return http.post("/v1/embeddings", json={"model": model, "input": ["a steady load sentence"]})


class GatewayLoad:
    KINDS = ["minilm", "runtime", "clip", "completions"]

    def __init__(self, url: str, clients: int = 8):
        self.url, self.calls, self._stop = url, [], threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(self.KINDS[i % 4],), daemon=True)
                         for i in range(clients)]

    def start(self) -> "GatewayLoad":
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(90)

    def _client(self, kind: str) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as http:
            while not self._stop.is_set():
                start = time.time()
                try:
                    r = request(http, kind)
                    status, detail = r.status_code, ("" if r.status_code == 200 else r.text[:300])
                    if r.status_code == 503 and "retry-after" not in r.headers:
                        detail = "503 without Retry-After: " + detail
                        status = -503
                except httpx.HTTPError as exc:
                    status, detail = None, f"{type(exc).__name__}: {exc}"
                self.calls.append(Call(kind, start, time.time(), status, detail))
                if status != 200:
                    time.sleep(0.2)  # as a client honouring Retry-After would, a little faster


def wait_for(predicate, timeout: float, what: str, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, what
        time.sleep(every)
    return value


def status_of(http: httpx.Client, path: str) -> tuple[int | None, dict]:
    try:
        r = http.get(path)
        return r.status_code, (r.json() if r.headers.get("content-type", "").startswith("application/json") else {})
    except httpx.HTTPError:
        return None, {}


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory):
    """The runtime models run on ONNX Runtime as under `make triton`: exported once for the module."""
    return tmp_path_factory.mktemp("onnx_cache")


@pytest.mark.parametrize("topology", ["launcher", "separate"])
def test_kill_9_tritonserver_under_load_everything_serves_again(topology, tmp_path, onnx_cache):
    import tritonclient.grpc as grpcclient

    ports = {"HTTP_PORT": free_port(), "GRPC_PORT": free_port(), "METRICS_PORT": free_port(),
             "GATEWAY_PORT": free_port()}
    data = tmp_path / "data"
    env = dict(os.environ, DATA_DIR=str(data), PRELOAD_MODELS=f"clip:{CLIP}", ONNX_CACHE_DIR=str(onnx_cache),
               HF_ENDPOINT="http://127.0.0.1:9", **{k: str(v) for k, v in ports.items()})
    env.pop("LOAD_MODELS", None)  # every shipped model, as `make triton`
    # one server with every model: its death is everyone's (one per domain: tests/test_domains_server.py)
    env["TRITON_DOMAINS"] = "one"
    log_path = tmp_path / "launcher.log"
    command = [sys.executable, "-m", "launcher"]
    if topology == "separate":
        command.append("--no-gateway")
    launcher = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log_path.open("w"), stderr=subprocess.STDOUT)
    gateway = None
    http = httpx.Client(base_url=f"http://127.0.0.1:{ports['GATEWAY_PORT']}", timeout=60)
    health_log: list[tuple[float, int | None, dict]] = []
    listings: list[tuple[float, int | None, dict]] = []
    load = None
    try:
        wait_for(lambda: "triton: ready" in log_path.read_text() or launcher.poll() is not None, 600,
                 "launcher never ready")
        assert launcher.poll() is None, log_path.read_text()[-3000:]
        if topology == "separate":  # the Kustomize pod's gateway container
            gateway = GatewayProcess(f"127.0.0.1:{ports['GRPC_PORT']}", port=ports["GATEWAY_PORT"], data_dir=data,
                                     log_file=tmp_path / "gateway.log",
                                     env={"SUPERVISOR_STATE_FILE": str(data / "run" / "supervisor.json"),
                                          "PRELOAD_MODELS": f"clip:{CLIP}", "ONNX_CACHE_DIR": str(onnx_cache)})
            gateway.start(timeout=300)
        r = http.post("/load_sentence_transformer_model", json={"model_name": ST_DEMO})
        assert r.status_code == 200, r.text
        wait_for(lambda: status_of(http, "/health")[0] == 200, 120, "gateway never healthy")
        server_pid = tritonserver_pid(launcher.pid)
        old_tree = process_tree(server_pid)
        old_regions = shm_regions_mapped(old_tree)
        assert old_regions

        load = GatewayLoad(http.base_url.__str__().rstrip("/")).start()
        wait_for(lambda: {c.kind for c in load.calls if c.status == 200} == set(GatewayLoad.KINDS), 120,
                 "not every kind of request answered before the kill")
        sampling = threading.Event()

        def sample():
            with httpx.Client(base_url=http.base_url, timeout=30) as probe:
                while not sampling.is_set():
                    health_log.append((time.time(), *status_of(probe, "/health")))
                    listings.append((time.time(), *status_of(probe, "/loaded_models")))
                    time.sleep(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        time.sleep(1)
        killed_at = time.time()
        os.kill(server_pid, signal.SIGKILL)
        healthy_at = wait_for(lambda: next((t for t, code, _ in health_log if t > killed_at and code == 200
                                            and any(c != 200 for t2, c, _ in health_log if killed_at < t2 < t)), None),
                              180, "the gateway's /health never came back to 200")
        time.sleep(3)  # clients serve again
        load.stop()
        sampling.set()
        sampler.join(10)

        # the restart and its parts, from the launcher's and the gateway's logs
        output = log_path.read_text()
        restarted = re.search(r"restarted and ready in ([\d.]+)s \(([\d.]+)s after its death\)", output)
        assert restarted, output[-3000:]
        assert "tritonserver is down (killed by SIGKILL)" in output
        gateway_log = (tmp_path / "gateway.log").read_text() if gateway else output
        # the new server has the shipped models only: the gateway loads its runtime model and CLIP again
        reloads = {m.group(1): float(m.group(2))
                   for m in re.finditer(r"re-sync: (.+?) serves again \(reloaded in ([\d.]+)s\)", gateway_log)}
        assert ST_DEMO in reloads and CLIP in reloads, gateway_log[-3000:]
        total = healthy_at - killed_at
        resync_end = max(reloads.values()) + float(restarted.group(2))
        print(f"\n{topology}: kill -9 tritonserver -> /health 200 after {total:.1f}s: the new server ready "
              f"{float(restarted.group(2)):.1f}s after the death (its start-up with every shipped model "
              f"{float(restarted.group(1)):.1f}s, the rest reaping and backoff); gateway re-sync (in parallel): "
              + ", ".join(f"{k} {v:.1f}s" for k, v in reloads.items())
              + f" (~{resync_end:.1f}s after the death); /health's own checks and the probe's period: the rest")

        # clients: only 200 and 503 with Retry-After, 503 only in the heal window
        bad = [c for c in load.calls if c.status not in (200, 503)]
        assert not bad, bad[:5]
        late = [c for c in load.calls if c.status == 503 and c.start > healthy_at + 1.0]
        assert not late, late[:5]
        refused = [c for c in load.calls if c.status == 503]
        assert refused and all(c.end >= killed_at for c in refused), refused[:3]
        after = {c.kind for c in load.calls if c.status == 200 and c.start > healthy_at}
        assert after == set(GatewayLoad.KINDS), after

        # /health: 503 naming the server, then 200
        unhealthy = [problems for t, code, problems in health_log if t > killed_at and code == 503]
        assert any("triton" in p.get("problems", {}) for p in unhealthy), unhealthy[:3]
        # /loaded_models: answered or refused with 503; a runtime model never listed as loaded while it is
        # being reloaded, and never missing from both lists
        for t, code, body in listings:
            assert code in (200, 503), (t - killed_at, code, body)
            if code == 200:
                loaded = {m["model_name"] for m in body["models"]}
                reloading = {m["model_name"] for m in body["reloading"]}
                assert {ST_DEMO, CLIP} <= loaded | reloading and not loaded & reloading, body
        final = http.get("/loaded_models").json()
        assert {ST_DEMO, CLIP} <= {m["model_name"] for m in final["models"]} and not final["reloading"]
        assert {ST_DEMO, CLIP, MINILM} <= {m["id"] for m in http.get("/v1/models").json()["data"]}

        # every shipped pipeline (gRPC, direct) and the runtime model serve again
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['GRPC_PORT']}")
        for name, pipeline in pipelines().items():
            if pipeline.stream:
                stream_call(client, name, pipeline.good(), timeout=60)
            else:
                client.infer(name, pipeline.good(), client_timeout=120)
        client.close()
        assert request(http, "runtime").status_code == 200
        # the dead server's stubs and regions were reaped
        assert not running(old_tree), "stubs of the dead server are still running"
        assert not [r for r in old_regions if os.path.exists(r)], "the dead server's /dev/shm regions are left"
        new_tree = process_tree(tritonserver_pid(launcher.pid))
        new_regions = shm_regions_mapped(new_tree)

        if gateway is not None:
            gateway.stop()
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=120) == 0
    finally:
        if load is not None:
            load.stop()
        http.close()
        if gateway is not None:
            gateway.stop()
        if launcher.poll() is None:  # a failure above: stop it as Ctrl-C does (it stops its server)
            launcher.send_signal(signal.SIGTERM)
            try:
                launcher.wait(120)
            except subprocess.TimeoutExpired:
                launcher.kill()
    wait_for(lambda: not running(new_tree), 15, "processes outlived the launcher")
    assert not [r for r in new_regions if os.path.exists(r)], "shared-memory regions outlived the launcher"


def test_the_gateway_reloads_its_models_into_a_server_restarted_underneath(tmp_path):
    """The kubelet restarts the `triton` container: the new server has only its shipped models. The gateway
    notices (down, then back), loads its runtime model again before admitting its requests, and every listing
    tells the truth meanwhile: the model is 'reloading' (503), never listed as served while it is not."""
    from launcher.triton_server import TritonServer

    data = tmp_path / "data"

    def new_server():
        return TritonServer(http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2],
                            explicit_models=["text_embedding"], extra_repositories=[data / "triton_models"],
                            log_file=tmp_path / "tritonserver.log")

    ports = (free_port(), free_port(), free_port())
    server = new_server().start(timeout=300)
    gateway = GatewayProcess(server.grpc_url, port=free_port(), data_dir=data, log_file=tmp_path / "gateway.log",
                             env={"PRELOAD_MODELS": "", "ONNX_EXPORT": "0", "HF_ENDPOINT": "http://127.0.0.1:9"})
    http = httpx.Client(base_url=gateway.url, timeout=60)
    samples: list[tuple[float, str, int | None, dict]] = []
    try:
        gateway.start(timeout=300)
        assert http.post("/load_sentence_transformer_model", json={"model_name": ST_DEMO}).status_code == 200
        before = request(http, "runtime").json()["data"][0]["embedding"]
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait()
        wait_for(lambda: status_of(http, "/health")[0] == 503, 30, "/health never said the server was down")
        assert request(http, "runtime").status_code == 503
        server.stop()  # reaps the dead one's stubs and regions
        server = new_server().start(timeout=300)
        until = time.monotonic() + 120
        while time.monotonic() < until:  # every listing and the model itself, until it serves again
            t = time.time()
            r = request(http, "runtime")
            samples.append((t, "embed", r.status_code, r.json()))
            for path in ("/loaded_models", "/v1/models", "/health"):  # each stamped when it was asked
                samples.append((time.time(), path, *status_of(http, path)))
            if r.status_code == 200:
                break
        assert samples[-4][2] == 200, samples[-4:]
        assert request(http, "runtime").json()["data"][0]["embedding"] == pytest.approx(before, abs=1e-5)
    finally:
        http.close()
        gateway.stop()
        server.stop()
    served_at = samples[-4][0]
    refused = [t for t, what, code, _ in samples if what == "embed" and code == 503]

    def truthful(t: float, says_serving: bool, body) -> None:
        # listed as serving at t: no request sent after t was refused; once a request served: listed
        if says_serving:
            assert not [r for r in refused if r > t], (t - served_at, body)
        else:
            assert t < served_at, (t - served_at, body)

    for t, what, code, body in samples:
        assert code in (200, 503), (what, code, body)
        if what == "embed" and code == 503:
            assert body["error"]["code"] in ("model_reloading", "server_unavailable"), body
        if what == "/loaded_models" and code == 200:
            loaded = {m["model_name"] for m in body["models"]}
            assert ST_DEMO in loaded | {m["model_name"] for m in body["reloading"]}, body
            truthful(t, ST_DEMO in loaded, body)
        if what == "/v1/models" and code == 200:
            truthful(t, ST_DEMO in {m["id"] for m in body["data"]}, body)
        if what == "/health" and code == 200:  # (a 503 may have other causes: only a 200 must be true)
            truthful(t, True, body)
    reloading = [body for t, what, code, body in samples if what == "/loaded_models" and code == 200 and body["reloading"]]
    health = [body for t, what, code, body in samples if what == "/health" and code == 503]
    print(f"\nre-sync: {len(samples) // 4} rounds until the model served again; listed as reloading in "
          f"{len(reloading)}; /health problems seen: {sorted({k for b in health for k in b.get('problems', {})})}")
    assert "re-sync: demo_models/st-cls-demo serves again" in (tmp_path / "gateway.log").read_text()
