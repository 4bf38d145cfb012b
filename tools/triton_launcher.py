"""Starts the tritonserver binary shipped in the nvidia-pytriton wheel over this repository.

Used by `make triton` (foreground, Ctrl-C / SIGTERM stop it cleanly) and by the test fixtures
(free ports, always stopped). Environment set-up follows ../shared/FINDINGS.md.
"""
from __future__ import annotations

import argparse
import glob
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL_REPOSITORY = ROOT / "model_repository"
BACKENDS = ROOT / "backends"
SHM_GLOB = "/dev/shm/triton_*shm_region_*"  # python: triton_python_backend_..., Python-based: triton_<backend>_backend_...


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
    # (HUB_DOWNLOADS, gateway/hub.py), whose environment is not this one
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    return tree


def process_group(pgid: int) -> list[int]:
    """Every process of a process group: a dead server's stubs, re-parented, are still in the server's."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                members.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return members


def shm_regions_mapped(pids: list[int]) -> set[str]:
    """The Python-backend shared-memory regions these processes map (a region already unlinked is skipped)."""
    regions = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            path = line.split(maxsplit=5)[-1]
            if path.startswith("/dev/shm/triton_") and "_shm_region_" in path and not path.endswith("(deleted)"):
                regions.add(path)
    return regions


class TritonServer:
    def __init__(self, host="127.0.0.1", http_port=8000, grpc_port=8001, metrics_port=8002,
                 model_repository=MODEL_REPOSITORY, explicit_models: list[str] | None = None,
                 log_file: Path | None = None, extra_args: list[str] | None = None,
                 extra_repositories: list[Path] | None = None, metrics_host: str | None = None):
        self.host, self.http_port, self.grpc_port, self.metrics_port = host, http_port, grpc_port, metrics_port
        self.metrics_host = metrics_host or host  # metrics are read-only: scrapers may reach them off loopback
        self.model_repository = Path(model_repository)
        # e.g. the gateway's generated models (DATA_DIR/triton_models): Triton serves both folders
        self.extra_repositories = [Path(p) for p in extra_repositories or []]
        self.explicit_models = explicit_models
        self.log_file = log_file
        self.extra_args = extra_args or []
        self.process: subprocess.Popen | None = None
        self.last_exit_code: int | None = None  # the previous process's, once stopped (tools/server_keeper.py)
        self._shm_before: set[str] = set()
        self._shm_seen: set[str] = set()  # regions this server's processes mapped, as of the last note

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
        ]
        if self.explicit_models is not None:
            cmd.append("--model-control-mode=explicit")
            cmd += [f"--load-model={m}" for m in self.explicit_models]
        return cmd + self.extra_args

    def start(self, timeout: float = 300.0, append_log: bool = False) -> "TritonServer":
        """`append_log`: a restart (tools/server_keeper.py) adds to the log instead of replacing it."""
        self._shm_before = set(glob.glob(SHM_GLOB))
        for repository in self.extra_repositories:
            repository.mkdir(parents=True, exist_ok=True)
        if self.log_file:
            Path(self.log_file).parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log_file, "ab" if append_log else "wb") if self.log_file else None
        self.process = subprocess.Popen(self.command(), env=server_env(), stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        if out is not None:
            out.close()  # the server holds its own copy
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with code {self.process.returncode}" + self._log_hint())
            if self.is_ready():
                return
            time.sleep(0.25)
        raise TimeoutError(f"tritonserver not ready after {timeout:.0f}s" + self._log_hint())

    def _log_hint(self) -> str:
        return f" (log: {self.log_file})" if self.log_file else ""

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
        self._shm_seen |= shm_regions_mapped(process_group(self.process.pid))
        try:  # stubs share the server's session: make sure none outlives it
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for region in self._shm_seen - self._shm_before:
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
            self._shm_seen |= shm_regions_mapped(process_tree(self.process.pid))

    def wait(self, note_every_s: float = 2.0) -> int:
        """Waits for the server to exit, noting its regions meanwhile; returns its exit code."""
        while True:
            try:
                return self.process.wait(note_every_s)
            except subprocess.TimeoutExpired:
                self.note_regions()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def shipped_models() -> list[str]:
    """Every model folder of model_repository/: what `make triton` loads at start (explicit mode)."""
    return sorted(p.parent.name for p in MODEL_REPOSITORY.glob("*/config.pbtxt"))


def main() -> int:
    parser = argparse.ArgumentParser(description="Serve model_repository/ with Triton and the gateway on this machine.")
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--http-port", type=int, default=int(os.environ.get("HTTP_PORT", 8000)))
    parser.add_argument("--grpc-port", type=int, default=int(os.environ.get("GRPC_PORT", 8001)))
    parser.add_argument("--metrics-port", type=int, default=int(os.environ.get("METRICS_PORT", 8002)))
    parser.add_argument("--gateway-port", type=int, default=int(os.environ.get("GATEWAY_PORT", 8080)))
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("DATA_DIR", ROOT / "data")))
    parser.add_argument("--no-gateway", action="store_true", help="serve Triton only")
    parser.add_argument("extra", nargs="*", help="extra tritonserver arguments (after --)")
    parser.add_argument("--max-restarts", type=int, default=int(os.environ.get("TRITON_MAX_RESTARTS", 5)),
                        help="restarts of a crashed tritonserver within --restart-window-s before giving up")
    parser.add_argument("--restart-window-s", type=float, default=float(os.environ.get("TRITON_RESTART_WINDOW_S", 120)))
    parser.add_argument("--server-log", type=Path, default=None,
                        help="tritonserver's output (default DATA_DIR/run/tritonserver.log; restarts append)")
    parser.add_argument("--load-models", default=os.environ.get("LOAD_MODELS", ""),
                        help="comma-separated models to load at start (default: every shipped model)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tools.cpu_notice import cpu_notice, cuda_devices
    from tools.gateway_process import GatewayKeeper, GatewayProcess
    from tools.server_keeper import CrashLoop, RestartPolicy, ServerKeeper

    data_dir = args.data_dir.resolve()
    from supervisor.exposure import admin_key, gateway_keys, is_loopback, restricted_api_args, restriction_required, \
        triton_host
    from supervisor.canaries import default_canaries
    from supervisor.monitor import Supervisor, admin_headers
    import logging

    logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)  # the supervisor's events

    state_file = data_dir / "run" / "supervisor.json"  # the supervisor writes it, the gateway's /health reads it
    os.environ["SUPERVISOR_STATE_FILE"] = str(state_file)
    key = None
    # Triton's inference ports stay on loopback (only the gateway, with its keys, faces HOST) unless
    # TRITON_HOST opts in to direct access; its metrics follow HOST for scrapers (docs/security.md)
    bind = triton_host()
    if not args.no_gateway:
        keys_file, key_file, generated_now = gateway_keys(args.host, data_dir)
        if keys_file is not None:
            os.environ["GATEWAY_API_KEYS_FILE"] = str(keys_file)  # the gateway inherits it
        if key_file is not None:
            print(f"gateway: HOST={args.host} is not loopback: every route but /health and /metrics/prometheus needs "
                  f"an API key; {'generated' if generated_now else 'using the'} admin key in {key_file} (mode 600, "
                  f"send it as 'Authorization: Bearer <key>')", flush=True)
        elif keys_file is None:
            print(f"gateway: HOST={args.host} is loopback and GATEWAY_API_KEYS_FILE is unset: the gateway is open "
                  "to local callers", flush=True)
    if not is_loopback(bind):
        print(f"triton: TRITON_HOST={bind}: Triton's HTTP and gRPC inference are reachable directly, without the "
              "gateway's keys and quotas", flush=True)
    if restriction_required(args.host) or not is_loopback(bind):
        key, generated = admin_key(data_dir / "run" / "triton_admin_key")
        os.environ["TRITON_ADMIN_KEY"] = key  # the gateway inherits it
        args.extra = restricted_api_args(key) + args.extra
        print(f"triton: HOST={args.host} is not loopback: model control and shared memory need the "
              f"'triton-admin-key' header" + (f" (generated key in {data_dir / 'run' / 'triton_admin_key'})"
                                               if generated else " (TRITON_ADMIN_KEY)"), flush=True)
    # Explicit model control: the shipped pipelines load at start; only the gateway loads and unloads others.
    server = TritonServer(bind, args.http_port, args.grpc_port, args.metrics_port, extra_args=args.extra,
                          explicit_models=[m for m in args.load_models.split(",") if m] or shipped_models(), extra_repositories=[data_dir / "triton_models"],
                          metrics_host=args.host, log_file=args.server_log or data_dir / "run" / "tritonserver.log")
    gateway_env = {}
    if "PRELOAD_MODELS" not in os.environ and (ROOT / "demo_models" / "clip-demo").is_dir():
        gateway_env["PRELOAD_MODELS"] = "clip:demo_models/clip-demo"  # the demo CLIP, next to all-MiniLM-L6-v2
    gateway = None if args.no_gateway else GatewayProcess(server.grpc_url, args.host, args.gateway_port, data_dir,
                                                          env=gateway_env)

    signals_seen = 0
    supervisor = None
    keeper = None

    def gateway_gave_up(message: str) -> None:
        print(f"triton: giving up: {message}", flush=True)
        keeper.request_stop()  # the main thread's watch returns: everything stops, exit code 1

    # restarts a gateway that dies (kill -9) while the launcher runs; made before the signal handler so
    # that a signal during start-up already tells it not to restart
    gateway_keeper = None if gateway is None else GatewayKeeper(
        gateway, RestartPolicy(max_restarts=args.max_restarts, window_s=args.restart_window_s),
        on_give_up=gateway_gave_up)

    def on_signal(signum, _frame):
        # Only note and forward: the main thread is inside the keeper's wait, which must not be re-entered.
        # The gateway drains first (DRAIN_S); the main thread stops Triton once the gateway has exited.
        nonlocal signals_seen
        signals_seen += 1
        if server.process is None and keeper is None:
            sys.exit(1)
        if signals_seen == 1:
            print(f"\ntriton: stopping (signal {signum})", flush=True)
            server.note_regions()  # the last look before the server exits
            if keeper is not None:
                keeper.request_stop()  # no restart from now on
            if supervisor is not None:
                supervisor.request_stop()  # stubs exiting on shutdown are not deaths
            if gateway_keeper is not None:
                gateway_keeper.request_stop()  # no restart from now on; SIGTERM to a running gateway: the drain
            if gateway is not None and gateway.process is not None:
                pass  # the main thread stops Triton once the gateway has drained and exited
            elif server.process is not None:
                server.process.send_signal(signal.SIGTERM)
        else:
            for process in (gateway and gateway.process, server.process):
                if process is not None:
                    try:
                        os.killpg(process.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    command = " ".join(server.command())
    print("triton: starting " + (command.replace(key, "<TRITON_ADMIN_KEY>") if key else command), flush=True)
    print(f"triton: server log {server.log_file}", flush=True)
    notice = cpu_notice(*cuda_devices())  # before Triton's own CUDA/DCGM lines, which it explains
    if notice:
        print(notice, flush=True)

    def new_supervisor() -> Supervisor:
        # a hung stub stays alive: a canary per BLS front served (only the gateway's own models load later)
        canaries = {model: canary for model, canary in default_canaries(server.grpc_url, admin_headers(key)).items()
                    if model in server.explicit_models}
        return Supervisor(lambda: server.process and server.process.pid, server.grpc_url, state_file, key,
                          canaries=canaries, canary_period_s=10.0, metrics_url=server.metrics_url).start()

    def on_down(cause: str) -> None:
        nonlocal supervisor  # the keeper logs the death, the reaping and the restart
        if supervisor is not None:
            supervisor.stop()  # its scans would race the reaping; a new one watches the new server
            supervisor = None

    def on_up() -> None:
        nonlocal supervisor
        restart = keeper.restarts[-1]
        # the gateway loads its runtime models again itself (gateway/server_watch.py): the shipped pipelines
        # serve meanwhile (measured: loading them all at start kept every pipeline down ~60 s longer)
        print(f"triton: tritonserver restarted and ready in {restart.start_s:.1f}s "
              f"({restart.ready_at - restart.died_at:.1f}s after its death)", flush=True)
        if not keeper.stopping:
            supervisor = new_supervisor()

    keeper = ServerKeeper(server, RestartPolicy(max_restarts=args.max_restarts, window_s=args.restart_window_s),
                          on_down=on_down, on_up=on_up)
    try:
        keeper.start()  # a server dying while it starts is restarted too
    except CrashLoop as exc:
        print(f"triton: giving up: {exc}", flush=True)
        return 1
    except Exception:
        server.stop()
        if signals_seen:  # Ctrl-C during start-up: stopped as asked, no traceback
            print("triton: stopped during start-up", flush=True)
            return 0
        raise
    if server.process is None:  # stopped by a signal while starting
        print("triton: stopped during start-up", flush=True)
        return 0
    if supervisor is None:
        supervisor = new_supervisor()
    try:
        if gateway is not None and not signals_seen:
            gateway.start()
    except BaseException:
        supervisor.stop()
        server.stop()
        if signals_seen:  # stopped while the gateway started
            return 0
        raise
    if gateway_keeper is not None:
        gateway_keeper.start_watching()  # returns at once if a signal came meanwhile
    print(f"triton: ready\n  HTTP    http://{server.http_url}\n  gRPC    {server.grpc_url}\n"
          f"  metrics {server.metrics_url}" + (f"\n  gateway {gateway.url} (docs: {gateway.url}/docs)" if gateway else "")
          + "\n  Ctrl-C stops everything", flush=True)
    code = 0
    try:
        code = keeper.watch()
    except CrashLoop as exc:
        print(f"triton: giving up: {exc}", flush=True)
        code = 1
    finally:
        if supervisor is not None:
            supervisor.stop()
        if gateway_keeper is not None:
            gateway_keeper.request_stop(signal_gateway=False)  # no restart while the gateway stops below
            gateway_keeper.join()
            if gateway_keeper.failure and not signals_seen:
                code = 1
        if gateway is not None:
            if signals_seen and gateway.process is not None:
                # the signal asked it to drain: requests in flight finish (DRAIN_S) before Triton stops
                try:
                    gateway.process.wait(float(os.environ.get("DRAIN_S", 25)) + 15)
                except subprocess.TimeoutExpired:
                    pass
            gateway.stop()
        server.stop()  # reaps stubs and /dev/shm regions left by a crash
    return 0 if signals_seen and code != 1 else code


if __name__ == "__main__":
    sys.exit(main())
