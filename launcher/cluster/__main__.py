"""`make cluster` (`python -m launcher.cluster run`) and `make cluster-rolling` (`python -m launcher.cluster
rolling`): the stand in the foreground, Ctrl-C / SIGTERM stops everything (a second signal kills it);
the rolling restart of a running one from another terminal."""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from launcher.cluster.rolling import rolling_restart
from launcher.cluster.stand import Cluster, Interrupted
from launcher.paths import ROOT


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.cluster",
                                     description="Redis + N replicas + HAProxy on this machine (docs/cluster.md).")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start the cluster in the foreground (Ctrl-C stops it)")
    run.add_argument("--replicas", type=int, default=int(os.environ.get("REPLICAS", 2)))
    run.add_argument("--models", default=os.environ.get("CLUSTER_MODELS", ""),
                     help="comma-separated models each replica loads at start (default: every shipped model)")
    run.add_argument("--redis-port", type=int, default=int(os.environ.get("REDIS_PORT", 0)) or None,
                     help="default: a free port")
    rolling = sub.add_parser("rolling", help="restart the replicas of a running cluster one at a time")
    for p in (run, rolling):
        p.add_argument("--port", type=int, default=int(os.environ.get("CLUSTER_PORT", 8090)))
        p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("DATA_DIR", ROOT / "data")))
    args = parser.parse_args()

    if args.command == "rolling":
        try:
            records = rolling_restart(args.data_dir.resolve() / "cluster", args.port)
        except (RuntimeError, TimeoutError) as exc:
            print(f"cluster-rolling: failed: {exc}", flush=True)
            return 1
        print(f"cluster-rolling: {len(records)} replicas restarted in {sum(r['total_s'] for r in records):.0f}s",
              flush=True)
        return 0

    cluster = Cluster(args.replicas, args.port, args.data_dir, [m for m in args.models.split(",") if m] or None,
                      host=os.environ.get("HOST", "127.0.0.1"), redis_port=args.redis_port,
                      echo=lambda line: print(line, flush=True))
    signals = []

    def on_signal(signum, _frame):
        signals.append(signum)
        if len(signals) == 1:
            print(f"\ncluster: stopping (signal {signum}): the replicas drain, then haproxy and redis stop", flush=True)
            cluster.request_stop()
        else:
            print("cluster: second signal: killing everything", flush=True)
            cluster.force_stop()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        cluster.start()
    except Interrupted:
        print("cluster: stopped during start-up", flush=True)
        return 0
    except (RuntimeError, TimeoutError, FileNotFoundError) as exc:
        print(f"cluster: failed to start: {exc}", flush=True)
        return 1
    lines = [f"cluster: ready: {len(cluster.replicas)} replicas behind {cluster.url}",
             f"  haproxy  {cluster.url}  (checks GET /health every 1s; runtime API {cluster.admin.socket_path})",
             f"  redis    {cluster.redis.public_url}  (password in {cluster.password_file})"]
    lines += [f"  {r.name}  {cluster.replica_url(r.index)}  (Triton HTTP {r.http_port}, gRPC {r.grpc_port}, metrics "
              f"{r.metrics_port}; log {r.log_file})" for r in cluster.replicas]
    lines.append("  make cluster-rolling restarts them one at a time; Ctrl-C stops everything")
    print("\n".join(lines), flush=True)
    while not cluster._stopping.wait(0.5):
        pass
    cluster.stop()
    print("cluster: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
