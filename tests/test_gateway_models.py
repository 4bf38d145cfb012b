"""Runtime model management through the live gateway: load, infer, unload (404 after), reload, delete
(files gone), LRU eviction at MAX_LOADED_MODELS, one load for concurrent duplicate loads, an unload
that lets in-flight requests finish; the memory an unload frees; bad input answered with a clear 4xx."""
from __future__ import annotations

import shutil
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from gateway_helpers import MINILM, ST_CLS_DEMO, b64, minilm_path, png_bytes
from model_configs import ROOT

pytestmark = pytest.mark.integration


def model_copy(root, name: str) -> str:
    """A copy of the small CLS sentence-transformers model under an allowed model root: a model of its own."""
    dest = root / name
    if not dest.exists():
        shutil.copytree(ROOT / ST_CLS_DEMO, dest)
    return str(dest)


def load(gateway, name: str):
    return gateway.http.post("/load_sentence_transformer_model", json={"model_name": name})


def embed(gateway, name: str, texts=("hello world",)):
    return gateway.http.post("/v1/embeddings", json={"model": name, "input": list(texts)})


def runtime_models(gateway) -> list[str]:
    return [m["model_name"] for m in gateway.http.get("/loaded_models").json()["models"] if m["model_name"] != MINILM]


def generated(gateway, name: str) -> list[str]:
    from gateway.modelgen import triton_name

    base = triton_name(name, None)
    return sorted(p.name for p in (gateway.process.data_dir / "triton_models").glob(base + "*"))


def rss_mib(pid: int) -> tuple[float, int]:
    """(RSS of the server and its stubs in MiB, process count)."""
    from tools.triton_launcher import process_tree

    total = 0
    tree = process_tree(pid)
    for p in tree:
        try:
            total += int(next(line for line in open(f"/proc/{p}/status") if line.startswith("VmRSS")).split()[1])
        except (OSError, StopIteration):
            pass
    return total / 1024, len(tree)


def test_load_infer_unload_reload_delete(gateway, extra_model_root):
    name = model_copy(extra_model_root, "lifecycle")
    first = load(gateway, name)
    assert first.status_code == 200 and "loaded" in first.json()["message"], first.text
    assert "already loaded" in load(gateway, name).json()["message"]
    info = next(m for m in gateway.http.get("/loaded_models").json()["models"] if m["model_name"] == name)
    assert info == {"model_name": name, "pretrained": None, "kind": "sentence_transformer", "dimension": 96}
    assert embed(gateway, name).status_code == 200
    pid = gateway.triton.server.process.pid
    before, processes = rss_mib(pid)
    assert gateway.http.post("/unload_model", json={"model_name": name}).status_code == 200
    import time

    deadline = time.monotonic() + 60
    while rss_mib(pid)[1] > processes - 3 and time.monotonic() < deadline:
        time.sleep(0.5)  # the stubs exit shortly after the unload returns
    after, left = rss_mib(pid)
    print(f"\nRSS of tritonserver + stubs: {before:.0f} MiB in {processes} processes before unload, "
          f"{after:.0f} MiB in {left} after ({before - after:.0f} MiB freed)")
    assert left <= processes - 3, "the model's three stubs exited"
    assert before - after > 50, "unloading frees the stubs' memory"
    gone = embed(gateway, name)
    assert gone.status_code == 404 and name in gone.json()["error"]["message"]
    assert name not in [m["id"] for m in gateway.http.get("/v1/models").json()["data"]]
    assert load(gateway, name).status_code == 200 and embed(gateway, name).status_code == 200
    assert generated(gateway, name), "the generated folders exist while loaded"
    assert gateway.http.post("/delete_model", json={"model_name": name}).status_code == 200
    assert generated(gateway, name) == [], "delete removes the generated folders"
    assert embed(gateway, name).status_code == 404
    assert gateway.http.post("/delete_model", json={"model_name": name}).status_code == 404
    assert load(gateway, name).status_code == 200, "a deleted model loads again"
    assert embed(gateway, name).status_code == 200
    assert gateway.http.post("/delete_model", json={"model_name": name}).status_code == 200


def test_concurrent_duplicate_loads_make_one_load(gateway, extra_model_root):
    name = model_copy(extra_model_root, "duplicate")
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: load(gateway, name), range(4)))
    assert [a.status_code for a in answers] == [200] * 4
    messages = [a.json()["message"] for a in answers]
    assert sum("already loaded" not in m for m in messages) == 1, messages
    assert gateway.log_tail(400).count(f"model {name} loaded into Triton") == 1
    gateway.http.post("/delete_model", json={"model_name": name})


def test_unload_lets_requests_in_flight_finish(gateway, extra_model_root):
    name = model_copy(extra_model_root, "in_flight")
    assert load(gateway, name).status_code == 200
    texts = [f"sentence number {i} with a few more words to encode" for i in range(64)]
    with ThreadPoolExecutor(9) as pool:
        requests = [pool.submit(embed, gateway, name, texts) for _ in range(8)]
        import time

        time.sleep(0.3)
        unload = pool.submit(lambda: gateway.http.post("/unload_model", json={"model_name": name}))
        statuses = [r.result().status_code for r in requests]
        assert unload.result().status_code == 200
    assert statuses.count(200) >= 1 and set(statuses) <= {200, 404}, statuses
    started_before_unload = statuses.count(200)
    print(f"\n{started_before_unload} of 8 requests were in flight at the unload and finished with 200")
    assert embed(gateway, name).status_code == 404
    gateway.http.post("/delete_model", json={"model_name": name})


def test_lru_eviction_at_capacity(gateway, extra_model_root):
    cap = 5  # the fixture's gateway runs with the default MAX_LOADED_MODELS
    names = [model_copy(extra_model_root, f"lru{i}") for i in range(cap + 1)]
    for name in names[:cap]:
        assert load(gateway, name).status_code == 200
        assert embed(gateway, name).status_code == 200
    assert sorted(runtime_models(gateway)) == sorted(names[:cap]), "older models were evicted first"
    assert embed(gateway, names[0]).status_code == 200  # names[0] is now the most recently used
    assert load(gateway, names[cap]).status_code == 200
    loaded = runtime_models(gateway)
    assert len(loaded) == cap and names[1] not in loaded and names[0] in loaded, loaded
    evicted = embed(gateway, names[1])
    assert evicted.status_code == 404 and names[1] in evicted.json()["error"]["message"]
    for name in names:
        gateway.http.post("/delete_model", json={"model_name": name})


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (no pixel data needed: the size is read from the header)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + chunk(b"IEND", b"")


BAD = [
    ("unknown model", "/v1/embeddings", {"model": "no/such-model", "input": "x"}, 404, "no/such-model"),
    ("empty input list", "/v1/embeddings", {"model": MINILM, "input": []}, 400, "empty"),
    ("empty string", "/v1/embeddings", {"model": MINILM, "input": ""}, 400, "empty"),
    ("too many inputs", "/v1/embeddings", {"model": MINILM, "input": ["x"] * 257}, 400, "MAX_INPUTS"),
    ("text too long", "/v1/embeddings", {"model": MINILM, "input": "x" * 70000}, 413, "MAX_TEXT_BYTES"),
    ("dimensions 0", "/v1/embeddings", {"model": MINILM, "input": "x", "dimensions": 0}, 400, "dimensions"),
    ("dimensions too big", "/v1/embeddings", {"model": MINILM, "input": "x", "dimensions": 385}, 400, "384"),
    ("token ids", "/v1/embeddings", {"model": MINILM, "input": [[1, 2, 3]]}, 400, "input"),
    ("non-image", "/infer", {"model_name": MINILM, "image": [b64(b"this is not an image at all")]}, 400, "not an image"),
    ("megapixels", "/infer", {"model_name": MINILM, "image": [b64(png_header(9000, 9000))]}, 413, "MAX_IMAGE_MEGAPIXELS"),
    ("url not allowed", "/infer", {"model_name": MINILM, "image": ["http://127.0.0.1:1/cat.png"]}, 400, "IMAGE_URL_ALLOWLIST"),
    ("bad base64", "/infer", {"model_name": MINILM, "image": ["%%%not base64%%%"]}, 400, "base64"),
    ("text model given images", "/infer", {"model_name": MINILM, "image": [b64(png_bytes())]}, 400, "does not embed images"),
    ("nothing to embed", "/infer", {"model_name": MINILM}, 400, "text or image"),
    ("path outside roots", "/load_sentence_transformer_model", {"model_name": "/etc"}, 400, "MODEL_ROOTS"),
    ("dot-dot path", "/load_sentence_transformer_model", {"model_name": "../../etc"}, 400, ".."),
    ("not a model folder", "/load_sentence_transformer_model", {"model_name": "backends"}, 400, "modules.json"),
    ("unknown open_clip pair", "/load_clip_model", {"model_name": "ViT-B-32", "pretrained": "nope"}, 400, "open_clip"),
    ("unload unknown", "/unload_model", {"model_name": "never/loaded"}, 404, "never/loaded"),
    ("missing field", "/load_clip_model", {}, 400, "model_name"),
]


@pytest.mark.parametrize("case,path,body,status,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_clear_4xx_and_the_service_keeps_serving(gateway, case, path, body, status, words):
    gateway.triton.load("text_embedding")
    r = gateway.http.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error["message"] and set(error) == {"message", "type", "param", "code"}, error
    assert "Traceback" not in r.text
    assert embed(gateway, MINILM).status_code == 200, "the service keeps serving"


def test_malformed_json_and_symlink_escape(gateway, extra_model_root):
    r = gateway.http.post("/v1/embeddings", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    link_root = ROOT / "demo_models"
    link = link_root / "escape-link"
    link.unlink(missing_ok=True)
    link.symlink_to("/etc")
    try:
        r = load(gateway, "demo_models/escape-link")
        assert r.status_code == 400 and "MODEL_ROOTS" in r.json()["error"]["message"], r.text
    finally:
        link.unlink()
    vectors = np.array([d["embedding"] for d in embed(gateway, MINILM, ["ok"]).json()["data"]])
    assert vectors.shape == (1, 384)
