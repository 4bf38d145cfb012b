"""The tritonserver binary shipped in the nvidia-pytriton wheel, over this repository: its command line,
environment, start, readiness and stop (stubs and /dev/shm regions reaped). Used by `make triton`
(launcher/stack.py, with launcher/server_keeper.py restarting it), the cluster, the benches and the
test fixtures (free ports, always stopped). The environment follows what this machine's Triton needs:
the venv's interpreter library first on LD_LIBRARY_PATH, the venv's bin first on PATH.
"""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

from gateway.telemetry.config import TRITON_SERVICE
from launcher.exposure import key_channel
from launcher.paths import BACKENDS, MODEL_REPOSITORY
from launcher.processes import lower_session_priority
from launcher.service import Service, answers, spawn
from supervisor.processes import SHM_GLOB, TreeRegions, process_group, process_tree, shm_regions_mapped


def tritonserver_binary() -> Path:
    import pytriton

    return Path(pytriton.__file__).parent / "tritonserver" / "bin" / "tritonserver"


def server_env() -> dict[str, str]:
    """LD_LIBRARY_PATH and PATH so the stub embeds this venv's interpreter and finds its packages."""
    import pytriton

    site = Path(pytriton.__file__).parent.parent
    libs = [sysconfig.get_config_var("LIBDIR"), str(site / "nvidia_pytriton.libs")]
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(libs + [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p])
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # Triton's stubs only read model folders on disk; hub downloads of runtime loads are the gateway's
    # (HUB_DOWNLOADS, gateway/hub/), whose environment is not this one
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def trace_args(traces_url: str | None) -> list[str]:
    """Triton's OpenTelemetry tracing to the gateway's OTLP/HTTP endpoint (gateway/telemetry/config.py):
    rate=0 traces no request of its own choosing, only those that carry a W3C context, i.e. the ones the
    gateway traces and samples; TIMESTAMPS is the level OpenTelemetry mode has (the default is OFF).
    Batching (OTEL_BSP_*) and OTEL_RESOURCE_ATTRIBUTES come from the environment, which Triton reads."""
    if not traces_url:
        return []
    settings = ["mode=opentelemetry", "level=TIMESTAMPS", "rate=0", "count=-1",
                f"opentelemetry,url={traces_url}", f"opentelemetry,resource=service.name={TRITON_SERVICE}"]
    return [arg for setting in settings for arg in ("--trace-config", setting)]


PYTHON_THREAD_POOL = 256  # see command()


class TritonServer(Service):
    name, not_up, poll_s = "tritonserver", "not ready", 0.25

    def __init__(self, host="127.0.0.1", http_port=8000, grpc_port=8001, metrics_port=8002,
                 model_repository=MODEL_REPOSITORY, explicit_models: list[str] | None = None,
                 log_file: Path | None = None, extra_args: list[str] | None = None,
                 extra_repositories: list[Path] | None = None, metrics_host: str | None = None,
                 traces_url: str | None = None, env: dict[str, str] | None = None, nice: int = 0):
        self.host, self.http_port, self.grpc_port, self.metrics_port = host, http_port, grpc_port, metrics_port
        self.nice = nice  # CPU priority below the box's others (launcher/domains.py: the codegen server's)
        self.env = dict(env or {})  # more environment for the server and its stubs (e.g. SUPERVISOR_STATE_FILE)
        self.traces_url = traces_url  # OTLP/HTTP: Triton traces the requests that carry a W3C context
        self.metrics_host = metrics_host or host  # metrics are read-only: scrapers may reach them off loopback
        self.model_repository = Path(model_repository)
        # e.g. the gateway's generated models (DATA_DIR/triton_models): Triton serves both folders
        self.extra_repositories = [Path(p) for p in extra_repositories or []]
        self.explicit_models = explicit_models
        self.log_file = log_file
        self.extra_args = extra_args or []
        self.process: subprocess.Popen | None = None
        self.last_exit_code: int | None = None  # the previous process's, once stopped (launcher/server_keeper.py)
        self._shm_before: set[str] = set()
        self._shm_seen = TreeRegions()  # regions this server's processes mapped, as of the last note

    @property
    def client_host(self) -> str:
        return "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host

    @property
    def http_url(self) -> str:
        return f"{self.client_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.client_host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        host = "127.0.0.1" if self.metrics_host in ("0.0.0.0", "") else self.metrics_host
        return f"http://{host}:{self.metrics_port}/metrics"

    def command(self) -> list[str]:
        cmd = [
            str(tritonserver_binary()),
            f"--model-repository={self.model_repository}",
            *[f"--model-repository={p}" for p in self.extra_repositories],
            f"--backend-directory={BACKENDS}",
            f"--http-address={self.host}", f"--http-port={self.http_port}",
            f"--grpc-address={self.host}", f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.metrics_host}", f"--metrics-port={self.metrics_port}",
            "--log-verbose=0",
            # Every config here is complete and no model.py defines auto_complete_config, yet with
            # auto-complete on, each Python-model load first runs a throwaway stub that imports model.py:
            # 5 s of the generator's 8.5 s heal (torch import), 1.7 s of the text encoder's 2.6 s (measured).
            "--disable-auto-complete-config",
            # each Python model instance's backend thread pool (default 32) holds a thread for every decoupled
            # BLS call until its first response, and the front's response sends need the same pool: the calls in
            # flight on a killed generator are never answered, which took all 32 of codegen_collect's and hung it
            # until a reload (issue 48); this leaves room for one kill's lost calls beside a full load
            f"--backend-config=python,thread-pool-size={PYTHON_THREAD_POOL}",
        ]
        if self.explicit_models is not None:
            cmd.append("--model-control-mode=explicit")
            cmd += [f"--load-model={m}" for m in self.explicit_models]
        nice = ["nice", "-n", str(self.nice)] if self.nice else []
        return nice + cmd + trace_args(self.traces_url) + self.extra_args

    def launch(self, append_log: bool = False) -> None:
        """`append_log`: a restart (launcher/server_keeper.py) adds to the log instead of replacing it."""
        self._shm_before = set(glob.glob(SHM_GLOB))
        for repository in self.extra_repositories:
            repository.mkdir(parents=True, exist_ok=True)
        if self.log_file:
            Path(self.log_file).parent.mkdir(parents=True, exist_ok=True)
        env = {**server_env(), **self.env}
        if self.traces_url:  # the stages' own spans (stage_common/tracing.py) go where Triton's go
            env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = self.traces_url
        command, env = key_channel(self.command(), env)  # the admin key off the command line (exposure.py)
        self.process = spawn(command, self.log_file, append=append_log, env=env)
        if self.nice:
            lower_session_priority(self.process.pid, self.nice)

    def is_up(self) -> bool:
        return answers(f"http://{self.http_url}/v2/health/ready")

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM the server, wait for its stubs to exit; kill the process group if it hangs."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.note_regions()
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        # a server that died (kill -9, abort) leaves its stubs re-parented but still in its process group
        seen = self._shm_seen.regions | shm_regions_mapped(process_group(self.process.pid))
        try:  # stubs share the server's session: make sure none outlives it
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for region in seen - self._shm_before:
            Path(region).unlink(missing_ok=True)
        self._shm_seen.clear()
        self.last_exit_code = self.process.returncode
        self.process = None

    def note_regions(self) -> None:
        """Remembers the shared-memory regions the server and its stubs map now, for stop() to remove: Triton
        leaves some behind (a model version it never unloads after a stub died keeps its regions to the
        end), and once the server has exited its processes can no longer be asked. Only this server's:
        other servers on the box (tests, soak) create theirs meanwhile."""
        if self.process is not None:
            self._shm_seen.note(process_tree(self.process.pid))

    def wait(self, note_every_s: float = 2.0) -> int:
        """Waits for the server to exit, noting its regions meanwhile; returns its exit code."""
        while True:
            try:
                return self.process.wait(note_every_s)
            except subprocess.TimeoutExpired:
                self.note_regions()


def shipped_models(repository: Path = MODEL_REPOSITORY) -> list[str]:
    """Every model folder of model_repository/: what `make triton` loads at start (explicit mode)."""
    return sorted(p.parent.name for p in Path(repository).glob("*/config.pbtxt"))
