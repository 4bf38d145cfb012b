"""Throughput of `/v1/embeddings` (one text per request, all-MiniLM-L6-v2 through `text_embedding`) through
`make cluster`'s HAProxy at concurrency 32, with 1 and with 2 replicas on this machine (launcher/cluster/,
each replica loading text_embedding only), plus the 1-replica gateway asked directly (what HAProxy costs).
Per setup: req/s, p50/p95, errors, and what a replica costs: its processes' RSS and CPU share over the
window, and its start time. Closed loop over HTTP (bench/http_load.py).

    .venv/bin/python -m bench.bench_cluster [--window 30] [--concurrency 32]

On a shared 2-core box the replicas compete for the same cores (and with whatever else runs): the
2-replica figure says what the second replica costs here, not what a machine per replica would give.
The scaling on paper is printed from the measured 1-replica figure."""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.http_load import run_http_load
from launcher.cluster.stand import Cluster, free_cluster_port
from supervisor.processes import process_tree

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def body_factory():
    counter = itertools.count()
    return lambda: {"model": MINILM, "input": [f"a sentence to embed, number {next(counter)}"]}


def replica_processes(cluster: Cluster) -> list[psutil.Process]:
    found = []
    for replica in cluster.replicas:
        for pid in process_tree(replica.process.pid):
            try:
                found.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
    return found


def measure(url: str, label: str, processes: list[psutil.Process], args) -> dict:
    for p in processes:
        try:
            p.cpu_percent(None)  # starts each process's CPU counter
        except psutil.NoSuchProcess:
            pass
    started = time.monotonic()
    result = run_http_load(f"{url}/v1/embeddings", body_factory(), args.concurrency, window=args.window,
                           warmup=args.warmup, label=label)
    elapsed = time.monotonic() - started
    cpu = 0.0
    for p in processes:
        try:
            cpu += p.cpu_percent(None)
        except psutil.NoSuchProcess:
            pass
    return {"label": label, "rps": result.throughput, "p50_ms": result.percentile(50) * 1000,
            "p95_ms": result.percentile(95) * 1000, "errors": result.errors, "first_error": result.first_error,
            "cpu_pct": cpu, "elapsed_s": elapsed}


def run(replicas: int, args) -> tuple[list[dict], dict]:
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        cluster = Cluster(replicas, free_cluster_port(replicas), Path(tmp) / "data", models=["text_embedding"],
                          env={"PRELOAD_MODELS": "", "HF_ENDPOINT": "http://127.0.0.1:9"}, echo=lambda line: None)
        started = time.monotonic()
        cluster.start()
        try:
            start_s = time.monotonic() - started
            processes = replica_processes(cluster)
            rss_mb = sum(p.memory_info().rss for p in processes) / 2 ** 20
            rows = [measure(cluster.url, f"{replicas} replica{'s' if replicas > 1 else ''} via haproxy", processes,
                            args)]
            if replicas == 1 and not args.no_direct:
                rows.append(measure(cluster.replica_url(0), "1 replica, gateway direct", processes, args))
        finally:
            cluster.stop()
    return rows, {"replicas": replicas, "start_s": start_s, "rss_mb": rss_mb}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--no-direct", action="store_true", help="skip the 1-replica gateway asked directly")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"bench_cluster: {os.cpu_count()} cores, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at "
          f"the start (a shared box: other work competes for the same cores)", flush=True)
    rows, costs = [], []
    for replicas in (1, 2):
        measured, cost = run(replicas, args)
        rows += measured
        costs.append(cost)
        for row in measured:
            print(f"  {row['label']:<28} c{args.concurrency}: {row['rps']:7.1f} req/s  p50 {row['p50_ms']:6.1f} ms  "
                  f"p95 {row['p95_ms']:6.1f} ms  errors {row['errors']}  replica CPU {row['cpu_pct']:.0f}%"
                  + (f"  first error: {row['first_error']}" if row["errors"] else ""), flush=True)
    print("\nwhat a replica costs (text_embedding only; RSS of the launcher, Triton + stubs, supervisor, gateway):")
    for cost in costs:
        print(f"  {cost['replicas']} replica(s): RSS {cost['rss_mb']:.0f} MB in all, start to serving "
              f"{cost['start_s']:.1f}s")
    one = next(r for r in rows if r["label"].startswith("1 replica via"))
    two = next(r for r in rows if r["label"].startswith("2 replicas"))
    print(f"\nthe second replica on this box: {two['rps'] / one['rps']:.2f}x the throughput of one "
          f"({two['rps'] - one['rps']:+.1f} req/s), RSS +{costs[1]['rss_mb'] - costs[0]['rss_mb']:.0f} MB")
    print(f"on paper, a machine per replica (same per-replica figure, HAProxy not the limit): "
          f"1 -> {one['rps']:.0f}, 2 -> {2 * one['rps']:.0f}, 4 -> {4 * one['rps']:.0f} req/s")
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
