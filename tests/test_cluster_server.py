"""`make cluster`'s code (launcher/cluster/) with real replicas: 2 launchers (Triton with text_embedding
only, to keep the start cheap; supervisor; gateway), Redis and HAProxy on free ports in a tmp data dir,
one cluster for the module, always stopped.

- requests through the load balancer reach both replicas (x-replica-id), each answers on its own port;
- the shared registry (REDIS_URL): a model registered through the load balancer serves on every replica,
  queried directly, with the same embeddings; a replica killed and restarted has it again without a call;
  an unload or a delete through the load balancer removes it everywhere; two replicas registering
  different models at once with MAX_LOADED_MODELS=1 leave exactly one, everywhere; Faiss is refused;
- kill -9 of one replica's gateway AND its tritonserver under 8 clients: requests go on on the other,
  only requests in flight at the kill may fail (counted, at most one per client), and the replica comes
  back by itself (its launcher restarts both) and serves through the load balancer again;
- `python -m launcher.cluster rolling` (what `make cluster-rolling` runs) under 8 clients: 0 failed requests;
- the stop leaves no process of the cluster, no /dev/shm region its servers mapped, no state file or
  socket. The figures are printed (`pytest -s`)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass

import httpx
import numpy as np
import pytest

from launcher.cluster.replicas import replica_processes
from launcher.cluster.stand import Cluster, free_cluster_port
from launcher.cluster.state import read_state
from launcher.paths import ROOT
from supervisor.processes import alive, process_tree, shm_regions_mapped

pytestmark = pytest.mark.integration
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass
class Call:
    start: float
    end: float
    status: int | None  # None: no HTTP answer
    replica: str | None
    detail: str = ""


class Load:
    """`clients` threads posting one-text embeddings through the load balancer, back to back."""

    def __init__(self, url: str, clients: int = 8):
        self.url, self.calls, self._stop = url, [], threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for thread in self._threads:
            thread.join(120)

    def _client(self):
        with httpx.Client(base_url=self.url, timeout=60) as http:
            while not self._stop.is_set():
                start = time.time()
                try:
                    r = http.post("/v1/embeddings", json={"model": MINILM, "input": ["a load sentence"]})
                    call = Call(start, time.time(), r.status_code, r.headers.get("x-replica-id"),
                                "" if r.status_code == 200 else r.text[:300])
                    if r.status_code == 200:
                        assert len(r.json()["data"][0]["embedding"]) == 384
                except httpx.HTTPError as exc:
                    call = Call(start, time.time(), None, None, f"{type(exc).__name__}: {exc}")
                self.calls.append(call)

    def failed(self) -> list[Call]:
        return [c for c in self.calls if c.status != 200]


def wait_for(predicate, timeout: float, what: str, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, what
        time.sleep(every)
    return value


def health(url: str) -> int | None:
    try:
        return httpx.get(f"{url}/health", timeout=3).status_code
    except httpx.HTTPError:
        return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    data = tmp_path_factory.mktemp("cluster") / "data"
    c = Cluster(2, free_cluster_port(2), data, models=["text_embedding"], echo=lambda line: print(line, flush=True),
                env={"PRELOAD_MODELS": "", "DRAIN_S": "5", "HF_ENDPOINT": "http://127.0.0.1:9",
                     # the cap race below; runtime models on torch (no ONNX export per replica: a quicker load)
                     "MAX_LOADED_MODELS": "1", "ONNX_EXPORT": "0"}, start_timeout_s=600)
    started = time.monotonic()
    c.start()
    print(f"cluster: 2 replicas serving {time.monotonic() - started:.1f}s after the start")
    try:
        yield c
    finally:
        c.stop()


def test_requests_reach_both_replicas_and_each_answers_directly(cluster):
    with httpx.Client(base_url=cluster.url, timeout=30) as http:
        seen = Counter(http.post("/v1/embeddings", json={"model": MINILM, "input": ["x"]}).headers["x-replica-id"]
                       for _ in range(8))
    assert set(seen) == {"replica-0", "replica-1"}, seen
    for replica in cluster.replicas:
        assert replica.gateway_port == cluster.port + 1 + replica.index
        r = httpx.post(f"{cluster.replica_url(replica.index)}/v1/embeddings", json={"model": MINILM, "input": ["x"]},
                       timeout=30)
        assert r.status_code == 200 and r.headers["x-replica-id"] == replica.name


ST_DEMO, CLIP_DEMO = "demo_models/st-cls-demo", "demo_models/clip-demo"


def runtime_models(url: str) -> dict[str, list[str]]:
    """Runtime-registered models ready on the replica at `url` -> the replicas it says have them."""
    listing = httpx.get(f"{url}/loaded_models", timeout=30).json()
    return {m["model_name"]: m["replicas"] for m in listing["models"] if m["model_name"] != MINILM}


def embed(url: str, model: str) -> np.ndarray | int:
    r = httpx.post(f"{url}/v1/embeddings", json={"model": model, "input": ["a red circle on a white background"]},
                   timeout=120)
    return np.array(r.json()["data"][0]["embedding"]) if r.status_code == 200 else r.status_code


def test_a_model_registered_through_the_balancer_serves_on_every_replica(cluster):
    started = time.monotonic()
    r = httpx.post(f"{cluster.url}/load_sentence_transformer_model?wait=all", json={"model_name": ST_DEMO},
                   timeout=600)
    everywhere = time.monotonic() - started
    assert r.status_code == 200, r.text
    assert r.json()["replicas"] == {"ready": 2, "live": 2, "ready_on": ["replica-0", "replica-1"]}
    vectors = []
    for replica in cluster.replicas:  # each queried on its own port, at once (goal: within 10 s)
        vectors.append(embed(cluster.replica_url(replica.index), ST_DEMO))
        assert isinstance(vectors[-1], np.ndarray), vectors[-1]
        assert runtime_models(cluster.replica_url(replica.index)) == {ST_DEMO: ["replica-0", "replica-1"]}
    np.testing.assert_allclose(vectors[0], vectors[1], atol=1e-5)
    print(f"registration to served everywhere: {everywhere:.1f}s (through the balancer, ?wait=all)")


def test_kill_9_of_a_replicas_gateway_and_triton_under_load(cluster):
    victim = cluster.replicas[1]
    launcher_pid = victim.process.pid
    processes = replica_processes(launcher_pid)
    assert len(processes["gateway"]) == 1 and len(processes["tritonserver"]) == 1, processes
    with Load(cluster.url) as load:
        time.sleep(5)
        killed_at = time.time()
        for pid in processes["gateway"] + processes["tritonserver"]:
            os.kill(pid, signal.SIGKILL)
        time.sleep(5)
        served_meanwhile = [c for c in load.calls if c.start > killed_at + 1 and c.status == 200]
        back = wait_for(lambda: health(cluster.replica_url(1)) == 200 and time.time(), 300,
                        "the killed replica did not come back by itself")
        # back in HAProxy (2 checks in a row), then it takes requests again
        cluster.admin.wait(victim.name, lambda row: row.get("status") == "UP", 30, "not UP again")
        time.sleep(5)
    failed = load.failed()
    print(f"kill -9: {len(load.calls)} requests, {len(failed)} failed; replica back {back - killed_at:.1f}s after "
          f"the kill; failures: {Counter(c.detail[:80] for c in failed)}")
    assert victim.process.pid == launcher_pid, "the launcher itself restarted its gateway and Triton"
    new = replica_processes(launcher_pid)
    assert new["gateway"] and new["tritonserver"] and not set(new["gateway"] + new["tritonserver"]) & set(
        processes["gateway"] + processes["tritonserver"])
    # only requests in flight at the kill may fail: one per client at most, none started well after it
    assert len(failed) <= 8, failed
    assert all(c.start <= killed_at + 2 for c in failed), failed
    assert served_meanwhile and {c.replica for c in served_meanwhile} >= {"replica-0"}
    after = [c for c in load.calls if c.start > back + 3]
    assert {c.replica for c in after if c.status == 200} == {"replica-0", "replica-1"}


def test_the_killed_replica_converged_to_the_registry_without_a_call(cluster):
    url = cluster.replica_url(1)
    assert runtime_models(url) == {ST_DEMO: ["replica-0", "replica-1"]}
    assert isinstance(embed(url, ST_DEMO), np.ndarray)


def test_rolling_restart_under_load_fails_no_request(cluster):
    before = [r.process.pid for r in cluster.replicas]
    with Load(cluster.url) as load:
        time.sleep(3)
        rolling = subprocess.run([sys.executable, "-m", "launcher.cluster", "rolling", "--port",
                                  str(cluster.port), "--data-dir", str(cluster.dir.parent)],
                                 cwd=ROOT, capture_output=True, text=True, timeout=900)
        time.sleep(3)
    print(rolling.stdout)
    failed = load.failed()
    print(f"rolling: {len(load.calls)} requests, {len(failed)} failed, "
          f"by replica {Counter(c.replica for c in load.calls)}")
    assert rolling.returncode == 0, rolling.stdout + rolling.stderr
    assert failed == []
    after = [r.process.pid for r in cluster.replicas]
    assert not set(after) & set(before), "each launcher was restarted"
    assert [r["pid"] for r in read_state(cluster.dir)["replicas"]] == after
    assert {c.replica for c in load.calls} == {"replica-0", "replica-1"}


def test_unload_and_delete_through_the_balancer_leave_every_replica(cluster):
    urls = [cluster.replica_url(r.index) for r in cluster.replicas]
    assert httpx.post(f"{cluster.url}/unload_model", json={"model_name": ST_DEMO}, timeout=120).status_code == 200
    wait_for(lambda: all(runtime_models(u) == {} for u in urls), 10, "still listed after the unload")
    assert [embed(u, ST_DEMO) for u in urls] == [404, 404]
    r = httpx.post(f"{cluster.url}/load_sentence_transformer_model?wait=all", json={"model_name": ST_DEMO},
                   timeout=600)
    assert r.status_code == 200 and r.json()["replicas"]["ready"] == 2, r.text
    assert httpx.post(f"{cluster.url}/delete_model", json={"model_name": ST_DEMO}, timeout=120).status_code == 200
    wait_for(lambda: all(runtime_models(u) == {} for u in urls), 10, "still listed after the delete")
    assert [embed(u, ST_DEMO) for u in urls] == [404, 404]


def test_two_replicas_registering_at_once_with_the_cap_at_one_leave_one_everywhere(cluster):
    urls = [cluster.replica_url(r.index) for r in cluster.replicas]
    results: dict[str, httpx.Response] = {}

    def register(url: str, path: str, model: str):
        results[model] = httpx.post(f"{url}{path}", json={"model_name": model}, timeout=600)

    threads = [threading.Thread(target=register, args=(urls[0], "/load_sentence_transformer_model", ST_DEMO)),
               threading.Thread(target=register, args=(urls[1], "/load_clip_model", CLIP_DEMO))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    codes = {m: r.status_code for m, r in results.items()}
    assert set(codes.values()) <= {200, 503} and 200 in codes.values(), {m: r.text for m, r in results.items()}
    wait_for(lambda: runtime_models(urls[0]).keys() == runtime_models(urls[1]).keys()
             and len(runtime_models(urls[0])) == 1, 30, "not one model everywhere")
    remaining = set(runtime_models(urls[0]))
    print(f"cap race: answers {codes}, remaining {remaining}")
    for model in remaining:
        httpx.post(f"{cluster.url}/delete_model", json={"model_name": model}, timeout=120)


def test_with_redis_a_faiss_collection_is_refused_naming_qdrant_url(cluster):
    r = httpx.put(f"{cluster.url}/collections/shared", json={"model": CLIP_DEMO, "store": "faiss"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "collection_not_shared", r.text
    assert "QDRANT_URL" in r.json()["error"]["message"]


def test_stop_leaves_no_process_region_or_state_file(cluster):
    trees = [pid for r in cluster.replicas for pid in process_tree(r.process.pid)]
    regions = shm_regions_mapped(trees)
    pids = trees + [cluster.haproxy.pid, cluster.redis.process.pid]
    assert regions, "the replicas' servers map /dev/shm regions"
    cluster.stop()
    assert [pid for pid in pids if alive(pid)] == []
    assert [region for region in regions if os.path.exists(region)] == []
    assert not cluster.state_file.exists() and not cluster.admin.socket_path.exists()
