"""Image search (issue 11): the stores in process, then the gateway end to end.

1. Stores: ingest N (default 100,000) random normalized 512-d vectors in batches of 10,000 (each write
   durable, as the gateway does it) into Faiss exact (IndexFlatIP), Faiss approximate (IndexPQFastScan
   re-ranked exactly; trained and built inside the ingest: searchable when the last write returns, no
   separate build time), and Qdrant local mode (ingest bounded by --qdrant-budget seconds: it is
   brute-force Python; the count reached is reported); the Faiss stores are then reopened from disk (log
   replay); then search at concurrency 1 and 16 (threads, closed loop): p50/p95 ms, searches/s,
   recall@10 against exact search.
2. Filtered search (issue 43 item 12), Faiss approximate at 100,000 and 1,000,000 points (64-d, the
   issue's case; payloads {"tag": one of 1,000, "half": 0 or 1}): p50/p95 and searches/s of an
   unfiltered search, of a selective filter (0.1% of the points) and an unselective one (50%), and of the
   scan of every payload that a filter cost before (the reference), with rows examined per search and
   recall@10 against that reference.
3. Gateway: 1,000 generated images indexed through POST /collections/NAME/points with the demo CLIP
   (images/s, Triton embedding included), then POST .../search by vector and by image at concurrency 1
   and 16 over HTTP (bench/http_load.py).

    python -m bench.bench_search [--vectors 100000] [--images 1000] [--window 5] [--quick]
    python -m bench.bench_search --only-filtered [--filtered-sizes 100000,1000000] [--filtered-dim 64]
As a `make bench` entry (`bench/suite.py --only search`) it starts its own tritonserver for part 2
(the gateway's generated models live in a DATA_DIR that server must serve).
"""
from __future__ import annotations

import argparse
import base64
import itertools
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench import load, stats
from bench.http_load import run_http_load
from bench.perf import format_report
from client.search import demo_image, encode
from gateway.search.faiss_store import FaissStore
from gateway.search.stores import matches, normalize_rows

MODELS: list[str] = []  # part 2 starts its own server (generated models)
DIM = 512
CLIP = "demo_models/clip-demo"


def random_vectors(n: int, seed: int) -> np.ndarray:
    return normalize_rows(np.random.default_rng(seed).standard_normal((n, DIM), dtype=np.float32))


def ingest(store, vectors: np.ndarray, batch: int, budget: float | None = None) -> tuple[int, float]:
    start = time.perf_counter()
    done = 0
    for lo in range(0, len(vectors), batch):
        chunk = vectors[lo:lo + batch]
        store.upsert([f"v{i}" for i in range(lo, lo + len(chunk))], chunk, [{}] * len(chunk))
        done += len(chunk)
        if budget is not None and time.perf_counter() - start > budget:
            break
    return done, time.perf_counter() - start


def closed_loop(search, queries: np.ndarray, concurrency: int, window: float) -> tuple[list[float], float]:
    """(latencies, searches/s) of `concurrency` threads searching back to back for `window` seconds."""
    run = load.run_threads(lambda call: search(queries[call.index % len(queries)]), concurrency, duration=window)
    return run.latencies, len(run.latencies) / run.seconds


def recall_at_10(search, queries: np.ndarray, truth: list[set]) -> float:
    return float(np.mean([len({h.id for h in search(q)} & t) / 10 for q, t in zip(queries, truth)]))


def faiss_ingest(label: str, folder: Path, ann_threshold: int, vectors: np.ndarray):
    """Ingest, then close and reopen (what a restart costs: snapshot load and log replay)."""
    store = FaissStore(folder, DIM, ann_threshold=ann_threshold)
    count, seconds = ingest(store, vectors, 10_000)
    store.close()
    start = time.perf_counter()
    store = FaissStore(folder, DIM, ann_threshold=ann_threshold)
    print(f"{label:20s} n={count:6d} ingest {seconds:7.2f}s, reopened in {time.perf_counter() - start:.2f}s "
          f"(snapshot generation {store.generation})", flush=True)
    return store, count, seconds


def bench_stores(n: int, window: float, qdrant_budget: float, folder: Path) -> None:
    vectors, queries = random_vectors(n, 0), random_vectors(200, 1)
    rows = []
    exact, count, seconds = faiss_ingest("faiss flat (exact)", folder / "exact", n + 1, vectors)
    truth = [{h.id for h in exact.exact_search(q, 10)} for q in queries]
    stores = [("faiss flat (exact)", exact, count, seconds)]
    approximate, count, seconds = faiss_ingest("faiss PQ fast scan", folder / "ann", 0, vectors)
    stores.append(("faiss PQ fast scan", approximate, count, seconds))
    from gateway.search.qdrant_store import QdrantStore, open_client

    client = open_client(folder / "qdrant")
    try:
        qdrant = QdrantStore(client, "bench", DIM, threading.Lock())
        count, seconds = ingest(qdrant, vectors, 2_000, qdrant_budget)
        stores.append(("qdrant local", qdrant, count, seconds))
        for label, store, count, seconds in stores:
            search = (lambda q, s=store: s.search(q, 10))
            sub_truth = truth if count == n else [{h.id for h in exact._exact(normalize_rows(q), 10, list(range(count)))}
                                                  for q in queries]
            recall = recall_at_10(search, queries, sub_truth)
            for concurrency in (1, 16):
                lat, rate = closed_loop(search, queries, concurrency, window)
                p50, p95 = (stats.percentile(lat, p) * 1e3 for p in (50, 95))
                rows.append((label, count, seconds, concurrency, p50, p95, rate, recall))
                print(f"{label:20s} n={count:6d} ingest {seconds:7.2f}s ({count / seconds:8.0f}/s)  c={concurrency:2d} "
                      f"p50 {p50:8.2f} ms p95 {p95:8.2f} ms {rate:8.1f} searches/s recall@10 {recall:.3f}",
                      flush=True)
    finally:
        client.close()
    print("\nsummary (stores, 512-d random normalized vectors):")
    print("  store                | points | ingest s | conc | p50 ms | p95 ms | searches/s | recall@10")
    for label, count, seconds, concurrency, p50, p95, rate, recall in rows:
        print(f"  {label:20s} | {count:6d} | {seconds:8.2f} | {concurrency:4d} | {p50:6.2f} | {p95:6.2f} | "
              f"{rate:10.1f} | {recall:.3f}")
    print(flush=True)


def scan_search(store: FaissStore, query: np.ndarray, limit: int, filter: dict):
    """What a filtered search did before the payload index: read every payload, score the matching rows."""
    with store._lock.read():
        rows = [store.row_of[i] for i, p in store.payloads.items() if matches(p, filter)]
        return store._exact(normalize_rows(query), limit, rows)


def bench_filtered(sizes: list[int], dim: int, window: float, folder: Path) -> None:
    rows = []
    for n in sizes:
        rng = np.random.default_rng(0)
        store = FaissStore(folder / f"filtered-{n}", dim, ann_threshold=20_000)  # the gateway's default
        start = time.perf_counter()
        for lo in range(0, n, 50_000):
            count = min(n, lo + 50_000) - lo
            vectors = normalize_rows(rng.standard_normal((count, dim), dtype=np.float32))
            store.upsert([f"v{i}" for i in range(lo, lo + count)], vectors,
                         [{"tag": f"t{i % 1000}", "half": i % 2} for i in range(lo, lo + count)])
        print(f"filtered: n={n} dim={dim} ingested in {time.perf_counter() - start:.1f}s "
              f"(approximate index: {store.approximate})", flush=True)
        queries = random_vectors(100, 1)[:, :dim]
        cases = [("unfiltered", None, lambda q, s=store: s.search(q, 10)),
                 ("tag (0.1%)", {"tag": "t7"}, lambda q, s=store: s.search(q, 10, {"tag": "t7"})),
                 ("half (50%)", {"half": 1}, lambda q, s=store: s.search(q, 10, {"half": 1})),
                 ("tag, before (scan)", {"tag": "t7"}, lambda q, s=store: scan_search(s, q, 10, {"tag": "t7"})),
                 ("half, before (scan)", {"half": 1}, lambda q, s=store: scan_search(s, q, 10, {"half": 1}))]
        for label, filter, search in cases:
            scan = "before" in label
            recall, examined = 1.0, float(n if scan else 0)  # the scan reads every payload: exact
            if not scan:  # recall against brute force over the (matching) points
                truth = [{h.id for h in (scan_search(store, q, 10, filter) if filter else store.exact_search(q, 10))}
                         for q in queries[:20]]
                before = store.examined
                recall = recall_at_10(search, queries[:20], truth)
                examined = (store.examined - before) / 20
            for concurrency in (1, 16):
                lat, rate = closed_loop(search, queries, concurrency, window)
                p50, p95 = (stats.percentile(lat, p) * 1e3 for p in (50, 95))
                rows.append((n, label, concurrency, p50, p95, rate, examined, recall))
                print(f"filtered: n={n:7d} {label:20s} c={concurrency:2d} p50 {p50:8.2f} ms p95 {p95:8.2f} ms "
                      f"{rate:8.1f} searches/s rows examined/search {examined:9.0f} recall@10 {recall:.3f}", flush=True)
        store.close()
    print(f"\nsummary (filtered search, Faiss approximate, {dim}-d random normalized vectors, limit 10):")
    print("  points  | search               | conc | p50 ms | p95 ms | searches/s | rows examined | recall@10")
    for n, label, concurrency, p50, p95, rate, examined, recall in rows:
        print(f"  {n:7d} | {label:20s} | {concurrency:4d} | {p50:6.2f} | {p95:6.2f} | {rate:10.1f} | "
              f"{examined:13.0f} | {recall:.3f}")
    print(flush=True)


def bench_gateway(images: int, window: float, warmup: float) -> None:
    import httpx

    from launcher.gateway_process import GatewayProcess
    from launcher.processes import free_port
    from launcher.triton_server import TritonServer

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        server = TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                              explicit_models=[], log_file=data / "tritonserver.log",
                              extra_repositories=[data / "triton_models"])
        server.start(timeout=300)
        gateway = None
        try:
            gateway = GatewayProcess(server.grpc_url, port=free_port(), data_dir=data, env={"PRELOAD_MODELS": ""},
                                     log_file=data / "gateway.log").start(timeout=180)
            pngs = [base64.b64encode(encode(demo_image(i))).decode() for i in range(images)]
            with httpx.Client(base_url=gateway.url, timeout=600) as http:
                http.post("/load_clip_model", json={"model_name": CLIP}).raise_for_status()
                for store in ("faiss", "qdrant"):
                    name = f"bench-{store}"
                    http.put(f"/collections/{name}", json={"model": CLIP, "store": store}).raise_for_status()
                    start = time.perf_counter()
                    for lo in range(0, images, 64):
                        points = [{"id": f"img-{i}", "image": pngs[i], "payload": {"pattern": i % 8}}
                                  for i in range(lo, min(images, lo + 64))]
                        http.post(f"/collections/{name}/points", json={"points": points}).raise_for_status()
                    seconds = time.perf_counter() - start
                    print(f"gateway {store}: indexed {images} images in {seconds:.1f}s = {images / seconds:.1f} images/s "
                          "(PNG 96x96, demo CLIP through Triton, batches of 64)", flush=True)
                dim = http.get("/collections/bench-faiss").json()["dimension"]
            vecs = itertools.cycle(random_vectors(200, 2)[:, :dim].tolist())
            imgs = itertools.cycle(pngs[:50])
            for store in ("faiss", "qdrant"):
                url = f"{gateway.url}/collections/bench-{store}/search"
                for kind, make in (("vector", lambda: {"vector": next(vecs), "limit": 10}),
                                   ("image", lambda: {"image": next(imgs), "limit": 10})):
                    for concurrency in (1, 16):
                        result = run_http_load(url, make, concurrency, window, warmup,
                                               label=f"gateway search {store} by {kind}")
                        print(f"---- gateway POST /collections/bench-{store}/search by {kind} (1,000 points), "
                              f"concurrency {concurrency}")
                        print(format_report(result), flush=True)
        finally:
            if gateway:
                gateway.stop()
            server.stop()


def run(ctx) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        bench_stores(20_000 if ctx.quick else 100_000, min(ctx.window, 5.0), 30 if ctx.quick else 120, Path(tmp))
    with tempfile.TemporaryDirectory() as tmp:
        bench_filtered([20_000, 100_000] if ctx.quick else [100_000, 1_000_000], 64, min(ctx.window, 3.0), Path(tmp))
    bench_gateway(200 if ctx.quick else 1000, min(ctx.window, 5.0), ctx.warmup)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vectors", type=int, default=100_000)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--qdrant-budget", type=float, default=120.0, help="seconds of Qdrant ingest at most")
    parser.add_argument("--skip-gateway", action="store_true")
    parser.add_argument("--filtered-sizes", default="100000,1000000", help="points of the filtered-search part")
    parser.add_argument("--filtered-dim", type=int, default=64)
    parser.add_argument("--only-filtered", action="store_true", help="the filtered-search part alone")
    parser.add_argument("--quick", action="store_true", help="20k vectors, 200 images, 2 s windows")
    args = parser.parse_args()
    if args.quick:
        args.vectors, args.images, args.window, args.warmup, args.qdrant_budget = 20_000, 200, 2.0, 0.5, 30
        args.filtered_sizes = "20000,100000"
    sizes = [int(n) for n in args.filtered_sizes.split(",") if n.strip()]
    if args.only_filtered:
        with tempfile.TemporaryDirectory() as tmp:
            bench_filtered(sizes, args.filtered_dim, args.window, Path(tmp))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        bench_stores(args.vectors, args.window, args.qdrant_budget, Path(tmp))
    with tempfile.TemporaryDirectory() as tmp:
        bench_filtered(sizes, args.filtered_dim, args.window, Path(tmp))
    if not args.skip_gateway:
        bench_gateway(args.images, args.window, args.warmup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
