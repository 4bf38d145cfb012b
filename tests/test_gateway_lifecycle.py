"""Model lifecycle through a live gateway: load, infer, unload (then 404), load again, delete (files
gone), load again, LRU eviction at MAX_LOADED_MODELS, concurrent duplicate loads, an unload while
requests are in flight, a restart restoring the loaded models, and the server's RSS before and after
an unload.

These tests run their own gateway (MAX_LOADED_MODELS=2) against the session's Triton, so that
evictions never touch the models other tests use: its DATA_DIR is its own (its own models.json) but
its `triton_models` is a link to the session's generated repository, the one Triton serves. Its models
are copies of demo_models/st-cls-demo in a temporary model root, so their Triton names are unique."""
from __future__ import annotations

import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from gateway.modelgen import triton_name
from gateway_helpers import ST_CLS_DEMO
from launcher.gateway_process import GatewayProcess
from launcher.processes import free_port
from model_configs import ROOT
from supervisor.processes import process_tree
from triton_fixtures import LiveGateway

pytestmark = pytest.mark.integration
SENTENCES = ["A man is eating food.", "The girl is carrying a baby.", "Stripes on a red square."]


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """Three copies of the CLS demo model (A, B, C) in a model root of their own."""
    root = tmp_path_factory.mktemp("model_root")
    paths = {}
    for name in "ABC":
        shutil.copytree(ROOT / ST_CLS_DEMO, root / f"st-{name}")
        paths[name] = str(root / f"st-{name}")
    return root, paths


@pytest.fixture(scope="module")
def lc(triton, data_dir, copies, tmp_path_factory):
    """A second gateway with MAX_LOADED_MODELS=2 in front of the session's Triton."""
    own = tmp_path_factory.mktemp("lifecycle_data")
    (data_dir / "triton_models").mkdir(parents=True, exist_ok=True)
    (own / "triton_models").symlink_to(data_dir / "triton_models", target_is_directory=True)
    env = {"MAX_LOADED_MODELS": "2", "PRELOAD_MODELS": "", "MODEL_ROOTS": f"{ROOT}:{copies[0]}",
           "MODEL_WAIT_S": "300"}
    log = tmp_path_factory.mktemp("lifecycle_gateway") / "gateway.log"
    process = GatewayProcess(triton.grpc_url, port=free_port(), data_dir=own, env=env, log_file=log)
    process.start(timeout=180)
    live = LiveGateway(process, triton)
    try:
        yield live
    finally:
        live.http.close()
        process.stop()


def embed(lc, model: str, texts=SENTENCES):
    return lc.http.post("/v1/embeddings", json={"model": model, "input": texts})


def loaded_names(lc) -> set[str]:
    r = lc.http.get("/loaded_models")
    assert r.status_code == 200, r.text
    return {m["model_name"] for m in r.json()["models"]}


def load(lc, model: str):
    r = lc.http.post("/load_sentence_transformer_model", json={"model_name": model})
    assert r.status_code == 200, r.text + lc.log_tail()
    return r.json()


def unload_all(lc, paths) -> None:
    for path in paths.values():
        if path in loaded_names(lc):
            assert lc.http.post("/unload_model", json={"model_name": path}).status_code == 200


def generated_folders(data_dir, model: str) -> list[str]:
    base = triton_name(model, None)
    return sorted(p.name for p in (data_dir / "triton_models").glob(f"{base}*"))


def triton_ready(lc, model: str) -> bool:
    try:
        return lc.triton.client.is_model_ready(triton_name(model, None))
    except Exception:  # noqa: BLE001 - an unknown model is "not ready"
        return False


def assert_not_loaded(response, model: str) -> None:
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert model in error["message"] and "not loaded" in error["message"], error


def test_load_infer_unload_reload_delete_reload(lc, copies, data_dir):
    from sentence_transformers import SentenceTransformer

    a = copies[1]["A"]
    reference = SentenceTransformer(a, device="cpu").encode(SENTENCES, normalize_embeddings=True)
    assert "loaded" in load(lc, a)["message"]
    assert a in loaded_names(lc) and triton_ready(lc, a)
    listed = {m["model_name"]: m for m in lc.http.get("/loaded_models").json()["models"]}[a]
    assert listed["kind"] == "sentence_transformer" and listed["dimension"] == reference.shape[1]
    r = embed(lc, a)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose([d["embedding"] for d in r.json()["data"]], reference, atol=1e-5)
    stats = {m["name"]: m for m in lc.http.get("/metrics").json()["model_stats"]}
    ensemble = stats[triton_name(a, None)]  # the seed's shape: Triton's statistics per model
    assert int(ensemble["inference_stats"]["success"]["count"]) >= 1
    assert triton_name(a, None) + "_encoder" in stats

    r = lc.http.post("/unload_model", json={"model_name": a})
    assert r.status_code == 200, r.text
    assert_not_loaded(embed(lc, a), a)
    assert_not_loaded(lc.http.post("/infer", json={"model_name": a, "text": ["x"]}), a)
    assert a not in loaded_names(lc) and not triton_ready(lc, a)
    assert lc.http.post("/unload_model", json={"model_name": a}).status_code == 404
    assert generated_folders(data_dir, a), "unload keeps the generated files"

    load(lc, a)
    np.testing.assert_allclose([d["embedding"] for d in embed(lc, a).json()["data"]], reference, atol=1e-5)

    r = lc.http.post("/delete_model", json={"model_name": a})
    assert r.status_code == 200, r.text
    assert generated_folders(data_dir, a) == [], "delete removes every generated folder"
    assert_not_loaded(embed(lc, a), a)
    assert lc.http.post("/delete_model", json={"model_name": a}).status_code == 404

    load(lc, a)  # a deleted model loads again (generated anew)
    assert len(generated_folders(data_dir, a)) == 4
    np.testing.assert_allclose([d["embedding"] for d in embed(lc, a).json()["data"]], reference, atol=1e-5)


def test_lru_eviction_at_capacity(lc, copies):
    paths = copies[1]
    unload_all(lc, paths)
    load(lc, paths["A"])
    load(lc, paths["B"])
    assert embed(lc, paths["A"]).status_code == 200  # B is now the least recently used
    load(lc, paths["C"])  # over MAX_LOADED_MODELS=2: B goes
    names = loaded_names(lc)
    assert paths["A"] in names and paths["C"] in names and paths["B"] not in names
    assert_not_loaded(embed(lc, paths["B"]), paths["B"])
    assert not triton_ready(lc, paths["B"]) and triton_ready(lc, paths["A"]) and triton_ready(lc, paths["C"])
    assert "sentence-transformers/all-MiniLM-L6-v2" in names, "the shipped model is never evicted"
    assert embed(lc, paths["A"]).status_code == 200 and embed(lc, paths["C"]).status_code == 200


def test_concurrent_duplicate_loads_load_once(lc, copies):
    paths = copies[1]
    unload_all(lc, paths)
    b = paths["B"]
    marker = f"model {b} loaded into Triton"
    before = lc.process.log_file.read_text().count(marker)
    barrier = threading.Barrier(6)

    def client(_):
        barrier.wait()
        return lc.http.post("/load_sentence_transformer_model", json={"model_name": b})

    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(client, range(6)))
    assert [r.status_code for r in responses] == [200] * 6, [r.text for r in responses]
    messages = [r.json()["message"] for r in responses]
    assert sum("already" not in m for m in messages) == 1, messages
    time.sleep(0.5)  # the log line is flushed by the gateway's logging handler
    assert lc.process.log_file.read_text().count(marker) == before + 1, "one generate + Triton load"
    assert embed(lc, b).status_code == 200


def test_unload_waits_for_requests_in_flight(lc, copies):
    a = copies[1]["A"]
    if a not in loaded_names(lc):
        load(lc, a)
    texts = [f"sentence number {i} " + "word " * 120 for i in range(64)]
    results: list[tuple[float, float, int]] = []
    stop = threading.Event()

    def client():
        while not stop.is_set():
            t0 = time.monotonic()
            r = embed(lc, a, texts)
            results.append((t0, time.monotonic(), r.status_code))
            if r.status_code != 200:
                return

    threads = [threading.Thread(target=client) for _ in range(6)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    unload_started = time.monotonic()
    r = lc.http.post("/unload_model", json={"model_name": a})
    unload_done = time.monotonic()
    stop.set()
    for t in threads:
        t.join(120)
    assert r.status_code == 200, r.text
    statuses = {s for _, _, s in results}
    assert statuses <= {200, 404}, results
    in_flight = [(t0, t1) for t0, t1, s in results if s == 200 and t0 < unload_started < t1]
    assert in_flight, f"no request was in flight during the unload: {results}"
    assert max(t1 for t0, t1 in in_flight) <= unload_done + 0.5, "the unload returned before its requests finished"
    assert_not_loaded(embed(lc, a), a)


def server_memory(pid: int) -> tuple[float, int]:
    """(RSS MiB, process count) of tritonserver and its stubs."""
    import psutil

    rss, count = 0, 0
    for p in process_tree(pid):
        try:
            rss += psutil.Process(p).memory_info().rss
            count += 1
        except psutil.Error:
            continue
    return rss / 2 ** 20, count


def settled_memory(pid: int, timeout: float = 60) -> tuple[float, int]:
    """server_memory once the process count has stayed the same for 3 s (stubs start and exit slowly)."""
    deadline = time.monotonic() + timeout
    last, since = server_memory(pid), time.monotonic()
    while time.monotonic() - since < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
        now = server_memory(pid)
        if now[1] != last[1]:
            since = time.monotonic()
        last = now
    return last


def test_unload_frees_memory(lc, copies):
    c = copies[1]["C"]
    pid = lc.triton.server.process.pid
    if c in loaded_names(lc):
        assert lc.http.post("/unload_model", json={"model_name": c}).status_code == 200
    before = settled_memory(pid)
    load(lc, c)
    assert embed(lc, c).status_code == 200
    loaded = settled_memory(pid)
    assert lc.http.post("/unload_model", json={"model_name": c}).status_code == 200
    after = settled_memory(pid)
    print(f"\nRSS of tritonserver + stubs: before load {before[0]:.0f} MiB ({before[1]} processes), "
          f"loaded {loaded[0]:.0f} MiB ({loaded[1]}), after unload {after[0]:.0f} MiB ({after[1]})")
    assert loaded[1] > before[1], "loading starts the model's stub processes"
    assert after[1] < loaded[1], "unloading stops them"
    assert after[0] < loaded[0] - 50, "their memory is given back"


def test_restart_restores_loaded_models(lc, copies):
    a = copies[1]["A"]
    if a not in loaded_names(lc):
        load(lc, a)
    lc.process.stop()
    lc.process.start(timeout=180)
    assert a in loaded_names(lc), lc.log_tail()
    assert embed(lc, a).status_code == 200
