"""`make cluster-rolling`: the replicas of a running cluster restarted one at a time, each drained in
HAProxy first, so that no request is cut (docs/cluster.md, "Rolling restarts")."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from launcher.cluster.haproxy import HAProxyAdmin
from launcher.cluster.probe import client_host, http_status
from launcher.cluster.state import owner_alive, read_state
from supervisor.processes import alive


def rolling_restart(cluster_dir: Path, port: int | None = None, up_timeout_s: float = 900.0, echo=print) -> list[dict]:
    """Restarts each replica in turn with the graceful drain: out of HAProxy first (`state drain`, until
    its sessions are 0), then SIGTERM to its launcher (the gateway drains, then Triton stops); the cluster
    process starts the launcher again; once its /health is 200 it goes back into HAProxy (`state ready`)
    and must be UP before the next replica goes out. Returns one timing record per replica."""
    state = read_state(cluster_dir)
    if not owner_alive(state):
        raise RuntimeError(f"no running cluster in {cluster_dir} (start it with `make cluster`)")
    if port is not None and state["port"] != port:
        raise RuntimeError(f"the cluster in {cluster_dir} is on port {state['port']}, not {port}")
    admin = HAProxyAdmin(Path(state["socket"]), state["backend"])
    host, drain_s = client_host(state["host"]), float(state.get("drain_s", 25))
    records = []
    for entry in state["replicas"]:
        name = entry["name"]
        if read_state(cluster_dir)["replicas"][entry["index"]].get("given_up"):
            echo(f"cluster-rolling: {name}: skipped (left down after a crash loop)")
            continue
        try:
            records.append(_roll_one(cluster_dir, admin, state, entry, host, drain_s, up_timeout_s, echo))
        except BaseException:
            try:  # not left out of HAProxy: its health checks decide again
                admin.set_state(name, "ready")
            except OSError:
                pass
            raise
    return records


def _roll_one(cluster_dir: Path, admin: HAProxyAdmin, state: dict, entry: dict, host: str, drain_s: float,
              up_timeout_s: float, echo) -> dict:
    name, started = entry["name"], time.monotonic()
    others = [e["name"] for e in state["replicas"] if e["name"] != name and not e.get("given_up")]
    for other in others:  # never take the last serving replica out
        admin.wait(other, lambda row: row.get("status") == "UP", up_timeout_s, "not UP (another replica)")
    admin.set_state(name, "drain")
    echo(f"cluster-rolling: {name}: draining in haproxy")
    admin.wait(name, lambda row: row.get("scur") == "0", drain_s + 30, "sessions did not end")
    old_pid = read_state(cluster_dir)["replicas"][entry["index"]]["pid"]
    if alive(old_pid):
        os.kill(old_pid, signal.SIGTERM)
    echo(f"cluster-rolling: {name}: SIGTERM to its launcher (pid {old_pid})")
    deadline = time.monotonic() + drain_s + 120
    while alive(old_pid):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name}: launcher {old_pid} still running {drain_s + 120:.0f}s after SIGTERM")
        time.sleep(0.25)
    stopped = time.monotonic()
    deadline = time.monotonic() + up_timeout_s
    while True:
        current = read_state(cluster_dir)
        if not owner_alive(current):
            raise RuntimeError("the cluster stopped during the rolling restart")
        new_pid = current["replicas"][entry["index"]]["pid"]
        if new_pid != old_pid and alive(new_pid) and \
                http_status(f"http://{host}:{entry['gateway_port']}/health") == 200:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name}: /health not 200 {up_timeout_s:.0f}s after its restart")
        time.sleep(0.5)
    admin.set_state(name, "ready")
    admin.wait(name, lambda row: row.get("status") == "UP", 60, "not UP after `state ready`")
    record = {"replica": name, "old_pid": old_pid, "new_pid": new_pid, "stop_s": stopped - started,
              "back_s": time.monotonic() - stopped, "total_s": time.monotonic() - started}
    echo(f"cluster-rolling: {name}: back in haproxy (pid {new_pid}); drained and stopped in "
         f"{record['stop_s']:.1f}s, serving again {record['back_s']:.1f}s later")
    return record
