"""A multi-replica stand on one machine: Redis, N complete replicas (each `python -m launcher`: Triton,
supervisor, gateway, its own ports and DATA_DIR) and Debian's HAProxy in front.

    make cluster REPLICAS=2 CLUSTER_PORT=8090     # foreground; Ctrl-C / SIGTERM stops everything
    make cluster-rolling CLUSTER_PORT=8090         # another terminal: restart the replicas one at a time

Both run `python -m launcher.cluster` (__main__.py). The parts: stand.py (the Cluster: start, keep, stop),
replicas.py (a replica's launcher, its keeper and what a dead one leaves), haproxy.py (its configuration,
process and runtime API), redis_server.py, state.py (`cluster.json`), rolling.py (`make cluster-rolling`).

Layout (DATA_DIR/cluster/): `cluster.json` (the running cluster's pids and ports: cluster-rolling reads
it, a second `make cluster` on the same data dir refuses while its owner lives; removed at stop),
`haproxy.cfg` (generated), `haproxy.sock` (HAProxy's runtime API, admin level, mode 600), `haproxy.log`,
`redis/` (its append-only file: the shared registry survives a restart) and `replica-<i>/` (the
replica's DATA_DIR, with `launcher.log`). Docs: docs/cluster.md."""
