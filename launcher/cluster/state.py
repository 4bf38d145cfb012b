"""`cluster.json`: the running cluster's pids and ports. `make cluster-rolling` reads it; a second `make
cluster` on the same data dir refuses while the process that wrote it lives; it is removed at stop."""
from __future__ import annotations

import json
from pathlib import Path

from supervisor.processes import still_runs

STATE = "cluster.json"


def read_state(cluster_dir: Path) -> dict:
    try:
        return json.loads((Path(cluster_dir) / STATE).read_text())
    except (OSError, ValueError):
        return {}


def write_state(cluster_dir: Path, state: dict) -> None:
    """Whole or not at all: a reader never sees half a file."""
    path = Path(cluster_dir) / STATE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(path)


def owner_alive(state: dict) -> bool:
    """The process that wrote the state file still runs (a pid reused since then does not count)."""
    pid = state.get("pid")
    return bool(pid) and still_runs((pid, state.get("pid_start")))
