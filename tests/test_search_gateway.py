"""Image search end to end through the live gateway with the demo CLIP (random weights): ~200
generated images indexed into a Faiss and a Qdrant collection, searched by image, text and vector;
delete, filter, persistence across a gateway stop/start, and every bad input a 4xx with nothing written."""
from __future__ import annotations

import struct
import sys
import zlib

import numpy as np
import pytest

from gateway_helpers import CLIP_DEMO, b64, error_of
from model_configs import ROOT

sys.path.insert(0, str(ROOT / "client"))
from search import demo_image, encode  # noqa: E402

pytestmark = pytest.mark.integration
N = 200
QUERIES = list(range(0, N, 20))


def png(i: int, transform=None) -> str:
    image = demo_image(i)
    return b64(encode(transform(image) if transform else image))


def index(http, name: str, store: str, n: int = N) -> None:
    r = http.put(f"/collections/{name}", json={"model": CLIP_DEMO, "store": store})
    assert r.status_code == 200, r.text
    for start in range(0, n, 64):
        points = [{"id": f"img-{i}", "image": png(i), "payload": {"pattern": i % 8, "hue": f"h{(i // 8) % 25}"}}
                  for i in range(start, min(n, start + 64))]
        r = http.post(f"/collections/{name}/points", json={"points": points})
        assert r.status_code == 200, r.text
    assert http.get(f"/collections/{name}").json()["count"] == n


@pytest.fixture(scope="module")
def clip(gateway):
    r = gateway.http.post("/load_clip_model", json={"model_name": CLIP_DEMO})
    assert r.status_code == 200, r.text
    return gateway


@pytest.fixture(scope="module", params=["faiss", "qdrant"])
def indexed(request, clip):
    name = f"search-test-{request.param}"
    index(clip.http, name, request.param)
    yield clip.http, name
    clip.http.delete(f"/collections/{name}")


def search(http, name: str, **body) -> list[dict]:
    r = http.post(f"/collections/{name}/search", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["processingTimeMs"] >= 0
    return r.json()["results"]


def test_an_indexed_image_finds_itself_first(indexed):
    http, name = indexed
    for i in QUERIES:
        results = search(http, name, image=png(i), limit=5)
        assert results[0]["id"] == f"img-{i}" and results[0]["score"] == pytest.approx(1.0, abs=1e-4)
        assert results[0]["payload"] == {"pattern": i % 8, "hue": f"h{(i // 8) % 25}"}
        scores = [r["score"] for r in results]
        assert scores == sorted(scores, reverse=True) and len(results) == 5


@pytest.mark.parametrize("variant", ["resized 96->80 px", "cropped 1 px each side"])
def test_a_resized_or_slightly_cropped_copy_finds_the_original_in_the_top_3(indexed, variant):
    """With the random-weight demo CLIP a resize or a 1-pixel crop holds; an 8% crop does not
    (random features are not crop-invariant), so this is the variant tested."""
    http, name = indexed
    transform = (lambda im: im.resize((80, 80))) if variant.startswith("resized") else (lambda im: im.crop((1, 1, 95, 95)))
    for i in QUERIES:
        assert f"img-{i}" in [r["id"] for r in search(http, name, image=png(i, transform), limit=3)]


def test_text_query_and_filter(indexed):
    http, name = indexed
    results = search(http, name, text="a red and white striped pattern", limit=7)
    assert len(results) == 7 and all(-1 <= r["score"] <= 1 for r in results)
    filtered = search(http, name, image=png(3), limit=50, filter={"pattern": 3})
    assert filtered[0]["id"] == "img-3" and len(filtered) == N // 8
    assert all(r["payload"]["pattern"] == 3 for r in filtered)
    assert search(http, name, image=png(3), limit=5, filter={"pattern": 3, "hue": "h1"})[0]["id"] == "img-11"


def test_both_stores_answer_the_same(clip):
    http = clip.http
    for store in ("faiss", "qdrant"):
        index(http, f"same-{store}", store, 64)
    try:
        vector = list(np.random.default_rng(0).standard_normal(clip_dimension(http)).astype(float))
        for body in ({"image": png(5)}, {"text": "blue dots"}, {"vector": vector}):
            a, b = (search(http, f"same-{s}", limit=10, **body) for s in ("faiss", "qdrant"))
            assert [r["id"] for r in a] == [r["id"] for r in b]
            np.testing.assert_allclose([r["score"] for r in a], [r["score"] for r in b], atol=1e-4)
    finally:
        for store in ("faiss", "qdrant"):
            http.delete(f"/collections/same-{store}")


def clip_dimension(http) -> int:
    return http.get("/collections/same-faiss").json()["dimension"]


def test_replace_and_delete_points(clip):
    http, name = clip.http, "search-test-delete"
    index(http, name, "faiss", 20)
    try:
        r = http.post(f"/collections/{name}/points", json={"points": [{"id": "img-4", "image": png(9)}]})
        assert r.status_code == 200 and r.json()["count"] == 20
        hits = search(http, name, image=png(9), limit=2)
        assert {h["id"] for h in hits} == {"img-4", "img-9"} and hits[1]["score"] == pytest.approx(1, abs=1e-4)
        r = http.request("DELETE", f"/collections/{name}/points", json={"ids": ["img-9", "img-4"]})
        assert r.status_code == 200 and r.json() == {"deleted": 2, "count": 18}
        assert not {"img-4", "img-9"} & {h["id"] for h in search(http, name, image=png(9), limit=18)}
    finally:
        http.delete(f"/collections/{name}")
    assert http.get(f"/collections/{name}").status_code == 404


def test_create_is_idempotent_and_conflicts_on_other_settings(clip):
    http = clip.http
    assert http.put("/collections/search-test-conf", json={"model": CLIP_DEMO}).json()["created"] is True
    try:
        again = http.put("/collections/search-test-conf", json={"model": CLIP_DEMO, "store": "faiss"})
        assert again.status_code == 200 and again.json()["created"] is False
        other = http.put("/collections/search-test-conf", json={"model": CLIP_DEMO, "store": "qdrant"})
        assert other.status_code == 409 and other.json()["error"]["type"] == "conflict_error"
        listed = {c["name"]: c for c in http.get("/collections").json()["collections"]}
        assert listed["search-test-conf"]["store"] == "faiss" and listed["search-test-conf"]["count"] == 0
    finally:
        http.delete("/collections/search-test-conf")


def test_collections_persist_across_a_gateway_stop_and_start(clip, tmp_path):
    """A second gateway on the session's DATA_DIR (so Triton finds its generated models) with its own
    COLLECTIONS_DIR (Qdrant local mode locks its folder to one process): index, stop with SIGTERM,
    start again, same answers."""
    import httpx

    from launcher.gateway_process import GatewayProcess
    from launcher.processes import free_port

    env = {"COLLECTIONS_DIR": str(tmp_path / "collections"), "MODEL_ROOTS": clip.process.env["MODEL_ROOTS"]}
    data_dir = clip.process.data_dir
    queries = [{"image": png(i)} for i in (1, 50, 99)] + [{"text": "green checks"}]

    def answers(http) -> dict:
        return {store: [[(r["id"], round(r["score"], 4)) for r in search(http, f"persist-{store}", limit=5, **q)]
                        for q in queries] for store in ("faiss", "qdrant")}

    first = GatewayProcess(clip.triton.grpc_url, port=free_port(), data_dir=data_dir, env=env,
                           log_file=tmp_path / "first.log").start(timeout=180)
    try:
        with httpx.Client(base_url=first.url, timeout=300) as http:
            assert http.post("/load_clip_model", json={"model_name": CLIP_DEMO}).status_code == 200
            for store in ("faiss", "qdrant"):
                index(http, f"persist-{store}", store, 100)
            http.request("DELETE", "/collections/persist-faiss/points", json={"ids": ["img-7"]})
            http.request("DELETE", "/collections/persist-qdrant/points", json={"ids": ["img-7"]})
            before = answers(http)
    finally:
        first.stop()
    second = GatewayProcess(clip.triton.grpc_url, port=free_port(), data_dir=data_dir, env=env,
                            log_file=tmp_path / "second.log").start(timeout=180)
    try:
        with httpx.Client(base_url=second.url, timeout=300) as http:
            assert http.post("/load_clip_model", json={"model_name": CLIP_DEMO}).status_code == 200
            assert {c["name"]: c["count"] for c in http.get("/collections").json()["collections"]} == \
                {"persist-faiss": 99, "persist-qdrant": 99}
            assert answers(http) == before
    finally:
        second.stop()


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (the size is read from the header)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + chunk(b"IEND", b"")


BAD = "search-test-bad"
BAD_INPUTS = [
    ("unknown collection", "post", "/collections/no-such/search", {"text": "x"}, 404, "no-such"),
    ("unknown collection points", "post", "/collections/no-such/points", {"points": [{"id": "a", "text": "x"}]}, 404, "no-such"),
    # the collection's dimension, a CLIP model: state, so a 409 (issue 52)
    ("wrong vector dimension", "post", f"/collections/{BAD}/search", {"vector": [0.1, 0.2, 0.3]}, 409, "dimension"),
    ("wrong point vector dimension", "post", f"/collections/{BAD}/points",
     {"points": [{"id": "a", "text": "ok"}, {"id": "b", "vector": [1.0, 2.0]}]}, 409, "dimension"),
    ("non-image", "post", f"/collections/{BAD}/points",
     {"points": [{"id": "a", "text": "ok"}, {"id": "b", "image": b64(b"not an image at all")}]}, 400, "image"),
    ("image over the megapixel limit", "post", f"/collections/{BAD}/points",
     {"points": [{"id": "a", "text": "ok"}, {"id": "b", "image": b64(png_header(9000, 9000))}]}, 413, "MAX_IMAGE_MEGAPIXELS"),
    ("limit 0", "post", f"/collections/{BAD}/search", {"text": "x", "limit": 0}, 400, "SEARCH_MAX_LIMIT"),
    ("limit over the maximum", "post", f"/collections/{BAD}/search", {"text": "x", "limit": 10_000}, 400, "SEARCH_MAX_LIMIT"),
    ("too many points", "post", f"/collections/{BAD}/points",
     {"points": [{"id": f"p{i}", "text": "x"} for i in range(257)]}, 400, "SEARCH_MAX_POINTS"),
    ("id with path characters", "post", f"/collections/{BAD}/points",
     {"points": [{"id": "ok", "text": "x"}, {"id": "../../etc/passwd", "text": "x"}]}, 400, "A-Za-z0-9_-"),
    ("collection name with path characters", "put", "/collections/..%5C..%5Cetc", {"model": CLIP_DEMO}, 400, "A-Za-z0-9_-"),
    ("collection name '..'", "post", "/collections/../search", {"text": "x"}, 404, "Not Found"),  # no such route
    ("collection name with a slash", "put", "/collections/a%2Fb", {"model": CLIP_DEMO}, 404, "Not Found"),
    ("collection name with a dot", "put", "/collections/a.b", {"model": CLIP_DEMO}, 400, "A-Za-z0-9_-"),
    ("collection name too long", "put", "/collections/" + "a" * 65, {"model": CLIP_DEMO}, 400, "A-Za-z0-9_-"),
    ("two queries", "post", f"/collections/{BAD}/search", {"text": "x", "vector": [1.0]}, 400, "exactly one"),
    ("float filter value", "post", f"/collections/{BAD}/search", {"text": "x", "filter": {"a": 1.5}}, 400, "filter"),
    ("reserved payload key", "post", f"/collections/{BAD}/points",
     {"points": [{"id": "a", "text": "x", "payload": {"__id": "b"}}]}, 400, "reserved"),
    ("model not loaded", "put", "/collections/search-test-nomodel", {"model": "demo_models/nothing-here"}, 404, "nothing-here"),
    ("not a CLIP model", "put", "/collections/search-test-st", {"model": "sentence-transformers/all-MiniLM-L6-v2"}, 409, "CLIP"),
    ("unknown store", "put", "/collections/search-test-store", {"model": CLIP_DEMO, "store": "milvus"}, 400, "store"),
]


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_a_4xx_and_nothing_is_written(clip, case):
    _, method, path, body, status, mention = case
    http = clip.http
    http.put(f"/collections/{BAD}", json={"model": CLIP_DEMO})
    http.post(f"/collections/{BAD}/points", json={"points": [{"id": "seed", "text": "a seed point"}]})
    names_before = {c["name"] for c in http.get("/collections").json()["collections"]}
    r = http.request(method.upper(), path, json=body)
    assert r.status_code == status, r.text
    error = error_of(r)
    assert mention in error["message"] and set(error) == {"message", "type", "param", "code"}
    assert http.get(f"/collections/{BAD}").json()["count"] == 1
    assert {c["name"] for c in http.get("/collections").json()["collections"]} == names_before


def test_client_indexes_a_folder_and_queries_it(clip, tmp_path):
    import subprocess

    script = [sys.executable, str(ROOT / "client" / "search.py"), "--gateway", clip.url]
    run = lambda *args: subprocess.run([*script, *args], capture_output=True, text=True, timeout=300)  # noqa: E731
    assert run("demo-images", str(tmp_path / "imgs"), "--count", "24").returncode == 0
    try:
        indexed = run("index", str(tmp_path / "imgs"), "--collection", "client-test", "--batch", "10")
        assert indexed.returncode == 0, indexed.stderr
        assert "client-test" in indexed.stdout and " 24" in indexed.stdout.splitlines()[-1]
        found = run("query", str(tmp_path / "imgs" / "demo_00007.png"), "--collection", "client-test", "--limit", "3")
        assert found.returncode == 0, found.stderr
        first = found.stdout.splitlines()[1].split()
        assert first[0] == "1" and first[2] == "demo_00007" and float(first[1]) > 0.999
        by_text = run("query", "--text", "blue stripes", "--collection", "client-test", "--limit", "2")
        assert by_text.returncode == 0 and len(by_text.stdout.splitlines()) == 4, by_text.stdout
        missing = run("query", "--text", "x", "--collection", "no-such-collection")
        assert missing.returncode == 1 and "404" in missing.stderr
    finally:
        clip.http.delete("/collections/client-test")
