"""How far the build of each pipeline is, while `make triton` builds the demo pipelines behind a running server
(issue 57): the files are the interface between the build (build/build_models.py and its training workers,
which write them), the launcher (which loads a pipeline into its server when it is ready) and the gateway
(which answers that pipeline's routes with a 503 and Retry-After until then, and shows the states in
/v1/models and /health). A folder, BUILD_STATE_DIR (DATA_DIR/run/build/ under `make triton`):

- `<pipeline>.json`: {"pipeline", "state": "building" | "built" | "ready" | "failed", "phase" (what it does now), "jobs"
  (its trainings), "started", "updated", "error"};
- `train-<job>.json`: {"job", "step", "total", "started", "updated"}, written by each training's log
  (build/common.TrainLog) every few steps.

Each file is replaced whole (a temporary file, then a rename): a reader sees the old state or the new one.
No folder, or no file for a pipeline: nothing is being built, the pipeline is what its server says."""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

STATE_DIR_VARIABLE = "BUILD_STATE_DIR"
# built: its files are made, the launcher is loading it into its server (its routes wait for `ready`)
BUILDING, BUILT, READY, FAILED = "building", "built", "ready", "failed"
# the routes that need a trained demo pipeline; /v1/embeddings needs text_embedding, which is built first
ROUTE_PIPELINES = {"/v1/completions": "codegen", "/v1/ner": "ner", "/v1/caption": "food_captioning"}
UNKNOWN_RETRY_S, MIN_RETRY_S, MAX_RETRY_S = 30, 5, 300


def write_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_pipeline(folder: Path, pipeline: str, **fields) -> None:
    """Sets `fields` of the pipeline's file (state, phase, jobs, error), keeping the others."""
    path = Path(folder) / f"{pipeline}.json"
    now = time.time()
    data = _read(path) or {"pipeline": pipeline, "started": now}
    if fields.get("state") == BUILDING and data.get("state") != BUILDING:
        data["started"], data["error"] = now, ""  # a new attempt
    data.update(fields, updated=now)
    write_atomic(path, data)


def write_job(folder: Path, job: str, step: int, total: int, started: float) -> None:
    write_atomic(Path(folder) / f"train-{job}.json",
                 {"job": job, "step": step, "total": total, "started": started, "updated": time.time()})


@dataclass
class PipelineBuild:
    pipeline: str
    state: str
    phase: str = ""
    step: int = 0  # of its trainings together
    total: int = 0
    started: float = 0.0  # of its first training that started (or of the build)
    error: str = ""
    jobs: list[str] = field(default_factory=list)

    def fraction(self) -> float | None:
        return self.step / self.total if self.total else None

    def eta_s(self, now: float | None = None) -> float | None:
        """Seconds left of its trainings, from their pace so far; None before the first steps."""
        fraction = self.fraction()
        if self.state not in (BUILDING, BUILT) or not fraction:
            return None
        elapsed = (now or time.time()) - self.started
        return max(0.0, elapsed * (1 - fraction) / fraction)

    def retry_after_s(self) -> int:
        eta = self.eta_s()
        return UNKNOWN_RETRY_S if eta is None else int(min(MAX_RETRY_S, max(MIN_RETRY_S, eta)))

    def as_json(self) -> dict:
        fraction, eta = self.fraction(), self.eta_s()
        out = {"state": self.state, "phase": self.phase}
        if self.total:
            out["progress"] = {"step": self.step, "total": self.total, "percent": round(100 * fraction, 1)}
        if eta is not None:
            out["eta_s"] = round(eta)
        if self.error:
            out["error"] = self.error
        return out

    def describe(self) -> str:
        """For a 503's message: what is happening and for how long still."""
        if self.state == FAILED:
            return f"the model of pipeline '{self.pipeline}' failed to build: {self.error or 'see the build log'}"
        done = f": step {self.step} of {self.total}, {100 * self.fraction():.0f}%" if self.total else ""
        eta = self.eta_s()
        left = f", about {eta:.0f} s left" if eta is not None else ""
        return f"the model of pipeline '{self.pipeline}' is being built ({self.phase or 'waiting'}{done}{left})"


def read(folder: Path | None) -> dict[str, PipelineBuild]:
    """Every pipeline the folder has a file for, its trainings' progress added up."""
    if folder is None or not Path(folder).is_dir():
        return {}
    folder = Path(folder)
    jobs = {d["job"]: d for p in folder.glob("train-*.json") if (d := _read(p)) and "job" in d}
    builds = {}
    for path in sorted(folder.glob("*.json")):
        data = _read(path)
        if path.name.startswith("train-") or not data or "pipeline" not in data:
            continue
        own = [jobs[j] for j in data.get("jobs", []) if j in jobs]
        builds[data["pipeline"]] = PipelineBuild(
            data["pipeline"], data.get("state", BUILDING), data.get("phase", ""),
            sum(int(j.get("step", 0)) for j in own), sum(int(j.get("total", 0)) for j in own),
            min([float(j.get("started", 0)) for j in own] or [float(data.get("started", 0))]),
            data.get("error", ""), list(data.get("jobs", [])))
    return builds


class BuildWatch:
    """The gateway's view of the folder, read again at most every `every_s` (a request reads no file)."""

    def __init__(self, folder: Path | None, every_s: float = 0.5):
        self.folder, self.every_s = folder, every_s
        self._at, self._builds = 0.0, {}

    def builds(self) -> dict[str, PipelineBuild]:
        now = time.monotonic()
        if now - self._at >= self.every_s:
            self._builds, self._at = read(self.folder), now
        return self._builds

    def pending(self, path: str) -> PipelineBuild | None:
        """The build that the route at `path` waits for (building or failed), or None: it may be served."""
        pipeline = ROUTE_PIPELINES.get(path.rstrip("/"))
        build = self.builds().get(pipeline) if pipeline else None
        return build if build is not None and build.state != READY else None
