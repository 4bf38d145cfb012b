"""`make triton` on a clone whose demo pipelines are not built yet (issue 57): the real embedding model serves at
once, and the trained pipelines are built behind the running servers, each loaded into its own domain's
server (explicit model control, the server's own process) as soon as it is ready.

Which pipeline needs a build is build/built_stamp's answer (its stamp is missing or from other build code).
The build is `python -m build.build_models --state-dir DATA_DIR/run/build <pipelines>` in a session of its
own (its output in DATA_DIR/run/build.log; one line here per pipeline ready or failed): two trainings at a
time, each pipeline exported as soon as its trainings are done, a failure that pipeline's alone. The state
folder is what the gateway reads for the 503s of the routes still waiting (gateway/build_state.py). Stopping
the launcher stops the build (its whole process group); `make triton` again resumes it: the trainings it
finished are in the machine's cache (build/trained_cache.py), the rest start again."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from gateway.build_state import BUILT, FAILED, READY, read, write_pipeline
from launcher.paths import MODEL_REPOSITORY, ROOT
from launcher.service import spawn

SERVES_AT_ONCE = "text_embedding"  # the real all-MiniLM-L6-v2: no training, exported in about a minute
DEMO_CLIP = "demo_models/clip-demo"  # embedding_demo's: the gateway's CLIP (PRELOAD_MODELS on a built tree)


def build_plan(profile: str, repository: Path | None = None) -> tuple[list[str], list[str]]:
    """(every pipeline, those to build), as build/built_stamp.py says (the launcher does not import build/)."""
    command = [sys.executable, "-m", "build.built_stamp", "--profile", profile]
    command += ["--repository", str(repository)] if repository else []
    answer = json.loads(subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True).stdout)
    return answer["pipelines"], answer["stale"]


def pipeline_of(model: str, pipelines: list[str]) -> str | None:
    """The pipeline whose build makes a model's files: text_embedding_encoder -> text_embedding."""
    return next((p for p in pipelines if model == p or model.startswith(p + "_")), None)


def is_ensemble(model: str, repository: Path = MODEL_REPOSITORY) -> bool:
    try:
        return 'platform: "ensemble"' in (repository / model / "config.pbtxt").read_text()
    except OSError:
        return False


def load_order(models: list[str], repository: Path = MODEL_REPOSITORY) -> list[str]:
    """Steps before the ensembles that chain them (an ensemble loads only once its steps are there)."""
    return sorted(models, key=lambda m: (is_ensemble(m, repository), m))


def load_demo_clip(gateway_url: str, admin_key_file: Path) -> str:
    """The demo CLIP, built behind a gateway that started without it, loaded through the gateway's own admin
    route (as PRELOAD_MODELS does at a start on a built tree). With API keys on, the launcher's generated admin
    key (launcher/exposure.py); with a keys file of the operator's own, the launcher has no key: it says so."""
    import httpx

    headers = {}
    if os.environ.get("GATEWAY_API_KEYS_FILE"):
        if not admin_key_file.is_file():
            return f"load the demo CLIP with POST /load_clip_model {{\"model_name\": \"{DEMO_CLIP}\"}} (an admin key)"
        headers["Authorization"] = f"Bearer {admin_key_file.read_text().strip()}"
    try:
        r = httpx.post(f"{gateway_url}/load_clip_model", json={"model_name": DEMO_CLIP}, headers=headers, timeout=900)
    except httpx.HTTPError as exc:
        return f"the gateway did not load the demo CLIP ({exc}): POST /load_clip_model loads it"
    if r.status_code != 200:
        return f"the gateway did not load the demo CLIP ({r.status_code}: {r.text[:200]})"
    return f"the gateway loaded the demo CLIP ({DEMO_CLIP}): serving"


def build_now(pipelines: list[str], profile: str, repository: Path | None = None) -> int:
    """Builds `pipelines` in the foreground (the output on this terminal): what must serve at once."""
    command = [sys.executable, "-m", "build.build_models", "--profile", profile, *pipelines]
    command += ["--repository", str(repository)] if repository else []
    return subprocess.run(command, cwd=ROOT).returncode


def progress_line(build) -> str:
    """'ner training 120/300 steps (40%), about 50 s left', or 'codegen waiting for training'."""
    line = f"{build.pipeline} {build.phase or 'waiting'}"
    if build.total:
        line += f" {build.step}/{build.total} steps ({100 * build.fraction():.0f}%)"
    eta = build.eta_s()
    return line + (f", about {eta:.0f} s left" if eta is not None else "")


class BuildBehind:
    """The background build and its watch: `on_ready(pipeline)` loads a pipeline that is built and returns (its
    error or None, a line saying how that went); the watch then marks it `ready` (the gateway serves it) or
    `failed`, and prints a line for each."""

    def __init__(self, pipelines: list[str], profile: str, state_dir: Path, log_file: Path,
                 on_ready: Callable[[str], tuple[str | None, str]], repository: Path | None = None, poll_s: float = 1.0,
                 progress_every_s: float = 30.0):
        self.pipelines, self.profile, self.state_dir, self.log_file = pipelines, profile, state_dir, log_file
        self.on_ready, self.repository, self.poll_s = on_ready, repository, poll_s
        self.progress_every_s = progress_every_s
        self.process: subprocess.Popen | None = None
        self.seen: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "BuildBehind":
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for old in self.state_dir.glob("*.json"):  # an earlier run's states say nothing of this one
            old.unlink(missing_ok=True)
        command = [sys.executable, "-m", "build.build_models", "--profile", self.profile,
                   "--state-dir", str(self.state_dir), *self.pipelines]
        command += ["--repository", str(self.repository)] if self.repository else []
        self.process = spawn(command, self.log_file, append=True, cwd=ROOT,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
        print(f"build: building {', '.join(self.pipelines)} behind the running server (two trainings at a time; "
              f"log {self.log_file}); their routes answer 503 with Retry-After until each is ready", flush=True)
        self._thread = threading.Thread(target=self._watch, name="build-behind", daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        said_at = time.monotonic()
        while not self._stop.is_set():
            exited = self.process.poll() is not None
            builds = read(self.state_dir)
            if time.monotonic() - said_at >= self.progress_every_s:  # one line now and then, not a scroll
                said_at = time.monotonic()
                going = [progress_line(b) for b in builds.values() if b.state not in (BUILT, READY, FAILED)]
                if going:
                    print("build: " + "; ".join(going), flush=True)
            for name, build in builds.items():
                if name in self.seen or build.state not in (BUILT, FAILED):
                    continue
                self.seen[name] = build.state
                if build.state == BUILT:  # into its server; then the gateway serves its routes
                    error, said = self.on_ready(name)
                    write_pipeline(self.state_dir, name, state=FAILED if error else READY, phase="",
                                   error=error or "")
                    print(f"build: {name} built; {said}", flush=True)
                    if not error:
                        continue
                    build.error = error
                print(f"build: {name} FAILED: {build.error} (its routes answer 503; `make triton` again "
                      f"retries it; log {self.log_file})", flush=True)
            if exited:
                left = [p for p in self.pipelines if p not in self.seen]
                if left:
                    print(f"build: the build ended (exit code {self.process.returncode}) before "
                          f"{', '.join(left)} (log {self.log_file})", flush=True)
                return
            self._stop.wait(self.poll_s)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self.process is not None and self.process.poll() is None:
            try:  # the trainings are its children, in its session
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            except ProcessLookupError:
                pass
        if self._thread is not None:
            self._thread.join(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Until the watch has seen every pipeline end (tests); True if it did."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._thread is not None and self._thread.is_alive():
            if deadline is not None and time.monotonic() > deadline:
                return False
            self._thread.join(0.5)
        return True
