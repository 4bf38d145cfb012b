"""`make triton` (`python -m launcher`): one Triton server per failure domain (launcher/domains.py,
`TRITON_DOMAINS`: codegen and encoders by default, `one` for a single server; launcher/triton_server.py), each
restarted when it crashes (launcher/server_keeper.py) and with a supervisor of its own, and the gateway
(launcher/gateway_process.py, restarted when it dies), in the foreground; Ctrl-C / SIGTERM drain the gateway
and stop everything cleanly. The image's CMD and the Kustomize pods' `triton` containers (`--no-gateway`, one
domain each) run the same.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from gateway.loopback import is_loopback
from gateway.telemetry.config import traces_url
from launcher.build_behind import (SERVES_AT_ONCE, BuildBehind, build_now, build_plan, load_demo_clip, load_order,
                                   pipeline_of)
from launcher.cpu_notice import cpu_notice, cuda_devices
from launcher.domains import DEFAULT, Domain, codegen_nice, codegen_ports, plan
from launcher.exposure import admin_key, gateway_keys, restricted_api_args, restriction_required, triton_host
from launcher.gateway_process import GatewayKeeper, GatewayProcess
from launcher.keeper import ENDED, CrashLoop, RestartPolicy
from launcher.paths import MODEL_REPOSITORY, ROOT
from launcher.server_keeper import ServerKeeper
from launcher.triton_server import TritonServer, shipped_models
from supervisor.canaries import default_canaries
from supervisor.monitor import Supervisor, admin_headers
from supervisor.state import STATE_FILE_VARIABLE


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m launcher",
                                     description="Serve model_repository/ with Triton and the gateway on this machine.")
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--http-port", type=int, default=int(os.environ.get("HTTP_PORT", 8000)))
    parser.add_argument("--grpc-port", type=int, default=int(os.environ.get("GRPC_PORT", 8001)))
    parser.add_argument("--metrics-port", type=int, default=int(os.environ.get("METRICS_PORT", 8002)))
    parser.add_argument("--domains", default=os.environ.get("TRITON_DOMAINS") or DEFAULT,
                        help="the Triton servers to run (TRITON_DOMAINS): 'encoders,codegen' (one per failure "
                             "domain), 'one' (a single server with every model), or one domain alone")
    http, grpc, metrics = codegen_ports()
    parser.add_argument("--codegen-http-port", type=int, default=http, help="CODEGEN_HTTP_PORT")
    parser.add_argument("--codegen-grpc-port", type=int, default=grpc, help="CODEGEN_GRPC_PORT")
    parser.add_argument("--codegen-metrics-port", type=int, default=metrics, help="CODEGEN_METRICS_PORT")
    parser.add_argument("--gateway-port", type=int, default=int(os.environ.get("GATEWAY_PORT", 8080)))
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("DATA_DIR", ROOT / "data")))
    parser.add_argument("--no-gateway", action="store_true", help="serve Triton only")
    parser.add_argument("extra", nargs="*", help="extra tritonserver arguments (after --)")
    parser.add_argument("--max-restarts", type=int, default=int(os.environ.get("TRITON_MAX_RESTARTS", 5)),
                        help="restarts of a crashed tritonserver within --restart-window-s before giving up")
    parser.add_argument("--restart-window-s", type=float, default=float(os.environ.get("TRITON_RESTART_WINDOW_S", 120)))
    parser.add_argument("--server-log", type=Path, default=None,
                        help="tritonserver's output (default DATA_DIR/run/tritonserver.log; restarts append; "
                             "the codegen server's beside it, tritonserver-codegen.log)")
    parser.add_argument("--load-models", default=os.environ.get("LOAD_MODELS", ""),
                        help="comma-separated models to load at start (default: every shipped model)")
    parser.add_argument("--model-repository", type=Path, default=Path(os.environ.get("MODEL_REPOSITORY") or
                                                                           MODEL_REPOSITORY),
                        help="the model repository to serve (and, with --build-behind, to build into)")
    parser.add_argument("--build-behind", action="store_true",
                        help="`make triton`: build text_embedding now if needed, serve, and build the other "
                             "pipelines that are not built behind the running servers (launcher/build_behind.py)")
    return parser.parse_args()


def apply_exposure(args: argparse.Namespace, data_dir: Path, bind: str) -> str | None:
    """The keys that HOST and TRITON_HOST call for (launcher/exposure.py), each said in one line: the gateway's
    API keys off loopback, and Triton's admin key (returned, None when not needed), whose restriction flags
    go before the extra tritonserver arguments. The gateway inherits both through the environment."""
    key = None
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
        args.extra = restricted_api_args() + args.extra  # the key travels in Triton's environment
        print(f"triton: HOST={args.host} is not loopback: model control and shared memory need the "
              f"'triton-admin-key' header" + (f" (generated key in {data_dir / 'run' / 'triton_admin_key'})"
                                               if generated else " (TRITON_ADMIN_KEY)"), flush=True)
    return key


class DomainServer:
    """One failure domain's tritonserver, its keeper and its supervisor (a new one per server life)."""

    def __init__(self, domain: Domain, server: TritonServer, state_file: Path, key: str | None,
                 policy: RestartPolicy, on_give_up):
        self.domain, self.server, self.state_file, self.key = domain, server, state_file, key
        self.supervisor: Supervisor | None = None
        self.keeper = ServerKeeper(server, policy, on_down=self._down, on_up=self._up)
        self.keeper.name = f"tritonserver{domain.label}"  # its lines: "tritonserver (codegen) is down (...)"
        self.keeper.on_give_up = on_give_up
        self.start_error: BaseException | None = None

    def new_supervisor(self) -> Supervisor:
        server = self.server
        # a hung stub stays alive: a canary per BLS front served (only the gateway's own models load later)
        canaries = {model: canary for model, canary in default_canaries(server.grpc_url, admin_headers(self.key)).items()
                    if model in server.explicit_models}
        return Supervisor(lambda: server.process and server.process.pid, server.grpc_url, self.state_file, self.key,
                          canaries=canaries, canary_period_s=10.0, metrics_url=server.metrics_url).start()

    def _down(self, cause: str) -> None:
        if self.supervisor is not None:  # the keeper logs the death, the reaping and the restart
            self.supervisor.stop()  # its scans would race the reaping; a new one watches the new server
            self.supervisor = None

    def _up(self) -> None:
        restart = self.keeper.restarts[-1]
        # the gateway loads its runtime models again itself (gateway/triton/server_watch.py): the shipped pipelines
        # serve meanwhile (measured: loading them all at start kept every pipeline down ~60 s longer)
        print(f"triton: tritonserver{self.domain.label} restarted and ready in {restart.start_s:.1f}s "
              f"({restart.ready_at - restart.down_since:.1f}s after its death)", flush=True)  # the outage's first
        if not self.keeper.stopping:
            self.supervisor = self.new_supervisor()

    def start(self) -> None:
        """The first start (a thread each: the servers load their models side by side); a failure is kept."""
        try:
            self.keeper.start()  # a server dying while it starts is restarted too
            if self.server.process is not None and self.supervisor is None and not self.keeper.stopping:
                self.supervisor = self.new_supervisor()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.start_error = exc

    def load(self, models: list[str]) -> str | None:
        """Loads `models` into the running server (explicit model control; steps before ensembles), then keeps
        them for its restarts and its supervisor's canaries. Returns the error, or None."""
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(self.server.grpc_url)
        try:
            for model in models:
                client.load_model(model, headers=admin_headers(self.key))
        except Exception as exc:  # noqa: BLE001 - reported by the caller; the server serves on
            return str(exc)[:300]
        finally:
            client.close()
        self.server.explicit_models = [*self.server.explicit_models,
                                       *[m for m in models if m not in self.server.explicit_models]]
        if self.supervisor is not None and not self.keeper.stopping:  # a new one, with the new models' canaries
            self.supervisor.stop()
            self.supervisor = self.new_supervisor()
        return None

    def request_stop(self) -> None:
        self.keeper.request_stop()  # no restart from now on
        if self.supervisor is not None:
            self.supervisor.request_stop()  # stubs exiting on shutdown are not deaths

    def stop(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()
            self.supervisor = None
        self.keeper.request_stop()
        self.keeper.join()
        self.server.stop()  # reaps stubs and /dev/shm regions left by a crash


def main() -> int:
    args = arguments()
    data_dir = args.data_dir.resolve()
    repository = args.model_repository.resolve()
    elsewhere = None if repository == MODEL_REPOSITORY.resolve() else repository  # the builds' --repository
    logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)  # the supervisor's events

    state_file = data_dir / "run" / "supervisor.json"  # the supervisor writes it, the gateway's /health reads it
    os.environ[STATE_FILE_VARIABLE] = str(state_file)  # Triton's stubs inherit it too (the codegen fronts)
    # Triton's inference ports stay on loopback (only the gateway, with its keys, faces HOST) unless
    # TRITON_HOST opts in to direct access; its metrics follow HOST for scrapers (docs/security.md)
    bind = triton_host()
    key = apply_exposure(args, data_dir, bind)
    # Explicit model control: the shipped pipelines load at start, each into its domain's server; only the
    # gateway loads and unloads others (into the main server, which has the generated repository too)
    try:
        domains = plan(args.domains, [m for m in args.load_models.split(",") if m] or shipped_models(repository),
                       (args.http_port, args.grpc_port, args.metrics_port),
                       (args.codegen_http_port, args.codegen_grpc_port, args.codegen_metrics_port), codegen_nice())
    except ValueError as exc:
        print(f"triton: {exc}", flush=True)
        return 2
    if not domains:
        print(f"triton: no server to run: no model of LOAD_MODELS={args.load_models!r} is in TRITON_DOMAINS="
              f"{args.domains!r}", flush=True)
        return 2
    behind: list[str] = []  # pipelines built behind the running servers (--build-behind)
    profile, pipelines = os.environ.get("MODEL_PROFILE", "demo"), []
    if args.build_behind:
        pipelines, stale = build_plan(profile, elsewhere)
        if SERVES_AT_ONCE in stale and build_now([SERVES_AT_ONCE], profile, elsewhere) != 0:
            print(f"triton: building {SERVES_AT_ONCE} failed (above)", flush=True)
            return 1
        served = {pipeline_of(m, pipelines) for domain in domains for m in domain.models}
        # LOAD_MODELS names some models: only their pipelines (the demo CLIP, embedding_demo, has no Triton model)
        behind = [p for p in stale if p != SERVES_AT_ONCE and (p in served or not args.load_models)]
    planned = {domain.name: list(domain.models) for domain in domains}
    if behind:
        for domain in domains:  # the rest join their servers when built
            domain.models = [m for m in domain.models if pipeline_of(m, pipelines) not in behind]
    log_file = args.server_log or data_dir / "run" / "tritonserver.log"
    policy = lambda: RestartPolicy(max_restarts=args.max_restarts, window_s=args.restart_window_s)  # noqa: E731
    done = threading.Event()  # a signal, or a keeper that gave up: everything stops
    starting = threading.Event()
    starting.set()
    gave_up: list[str] = []

    def server_gave_up(message: str) -> None:
        gave_up.append(message)
        if not starting.is_set():  # while starting, the main thread says it, with the log's last lines
            print(f"triton: giving up: {message}", flush=True)
        done.set()

    servers = [DomainServer(domain, TritonServer(
        bind, domain.http_port, domain.grpc_port, domain.metrics_port, extra_args=args.extra, model_repository=repository,
        explicit_models=domain.models, extra_repositories=[data_dir / "triton_models"] if domain.main else [],
        metrics_host=args.host, log_file=domain.file(log_file), traces_url=traces_url(),  # the gateway traces alike
        env={STATE_FILE_VARIABLE: str(domain.file(state_file))}, nice=domain.nice), domain.file(state_file), key, policy(),
        server_gave_up) for domain in domains]
    main_server = next((s for s in servers if s.domain.main), servers[0]).server
    codegen = next((s for s in servers if not s.domain.main), None)
    gateway_env = {}
    if codegen is not None:  # the codegen models' calls go to their own server (gateway/triton/domains.py)
        gateway_env.update({"CODEGEN_GRPC_URL": codegen.server.grpc_url,
                            "CODEGEN_SUPERVISOR_STATE_FILE": str(codegen.state_file)})
    build_state = data_dir / "run" / "build"
    if behind:
        gateway_env["BUILD_STATE_DIR"] = str(build_state)  # the 503s of the routes still waiting
    if "PRELOAD_MODELS" not in os.environ and (ROOT / "demo_models" / "clip-demo").is_dir():
        gateway_env["PRELOAD_MODELS"] = "clip:demo_models/clip-demo"  # the demo CLIP, next to all-MiniLM-L6-v2
    gateway = None if args.no_gateway else GatewayProcess(main_server.grpc_url, args.host, args.gateway_port,
                                                          data_dir, env=gateway_env)

    signals_seen = 0

    def gateway_gave_up(message: str) -> None:
        gave_up.append(message)
        print(f"triton: giving up: {message}", flush=True)
        done.set()  # the main thread's wait returns: everything stops, exit code 1

    # restarts a gateway that dies (kill -9) while the launcher runs; made before the signal handler so
    # that a signal during start-up already tells it not to restart
    gateway_keeper = None if gateway is None else GatewayKeeper(
        gateway, RestartPolicy(max_restarts=args.max_restarts, window_s=args.restart_window_s),
        on_give_up=gateway_gave_up)

    def on_signal(signum, _frame):
        # Only note and forward: the keepers run in threads, which stop at their next look.
        # The gateway drains first (DRAIN_S); the main thread stops the servers once the gateway has exited.
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen == 1:
            print(f"\ntriton: stopping (signal {signum})", flush=True)
            for kept in servers:  # no restart from now on, before the slow look below (a keeper may restart meanwhile)
                kept.request_stop()
            if gateway_keeper is not None:
                gateway_keeper.request_stop()  # no restart from now on; SIGTERM to a running gateway: the drain
            for kept in servers:
                kept.server.note_regions()  # the last look before the server exits
            if gateway is None or gateway.process is None:  # else they stop once the gateway has drained
                for kept in servers:
                    process = kept.server.process
                    if process is not None and process.poll() is None:
                        process.send_signal(signal.SIGTERM)
            done.set()
        else:
            for process in [gateway and gateway.process] + [kept.server.process for kept in servers]:
                if process is not None:
                    try:
                        os.killpg(process.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            for kept in [kept.keeper for kept in servers] + [gateway_keeper]:
                if kept is not None:
                    kept.kill_all()  # whatever else a keeper ever started (launcher/keeper.py)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    for kept in servers:
        command = " ".join(kept.server.command())
        print(f"triton: starting{kept.domain.label} " + (command.replace(key, "<TRITON_ADMIN_KEY>") if key else command),
              flush=True)
        print(f"triton: server log{kept.domain.label} {kept.server.log_file}", flush=True)
    notice = cpu_notice(*cuda_devices())  # before Triton's own CUDA/DCGM lines, which it explains
    if notice:
        print(notice, flush=True)

    def stop_all() -> None:
        for kept in servers:
            kept.stop()

    starts = [threading.Thread(target=kept.start, name=f"start-{kept.domain.name}", daemon=True) for kept in servers]
    for thread in starts:
        thread.start()
    for thread in starts:
        while thread.is_alive():
            thread.join(0.5)  # short joins: the signal handler runs meanwhile
    starting.clear()
    failed = [kept for kept in servers if kept.start_error is not None]
    if failed or signals_seen or gave_up or any(kept.server.process is None for kept in servers):
        stop_all()
        if signals_seen:  # Ctrl-C during start-up: stopped as asked, no traceback
            print("triton: stopped during start-up", flush=True)
            return 0
        crash_loops = [kept for kept in failed if isinstance(kept.start_error, CrashLoop)]
        for kept in crash_loops:
            print(f"triton: giving up: {kept.start_error}", flush=True)
        if failed and not crash_loops:
            raise failed[0].start_error
        return 1
    try:
        if gateway is not None and not signals_seen:
            gateway.start()
    except BaseException:
        stop_all()
        if signals_seen:  # stopped while the gateway started
            return 0
        raise
    for kept in servers:
        kept.keeper.start_watching()  # a thread each: a death restarts that server alone
    if gateway_keeper is not None:
        gateway_keeper.start_watching()  # returns at once if a signal came meanwhile
    lines = [f"  HTTP{kept.domain.label}    http://{kept.server.http_url}\n  gRPC{kept.domain.label}    "
             f"{kept.server.grpc_url}\n  metrics{kept.domain.label} {kept.server.metrics_url}" for kept in servers]
    print("triton: ready\n" + "\n".join(lines)
          + (f"\n  gateway {gateway.url} (docs: {gateway.url}/docs)" if gateway else "")
          + "\n  Ctrl-C stops everything", flush=True)
    builder = None
    if behind and not done.is_set():
        def load_pipeline(pipeline: str) -> tuple[str | None, str]:
            """Into the server(s) of its domain: the same processes that serve the rest."""
            loaded, errors = [], []
            for kept in servers:
                own = [m for m in planned[kept.domain.name] if pipeline_of(m, pipelines) == pipeline]
                error = kept.load(load_order(own, repository)) if own else None
                (errors if error else loaded).append(f"tritonserver{kept.domain.label}: {error}" if error else
                                                     f"{len(own)} models into tritonserver{kept.domain.label}"
                                                     if own else "")
            if errors:
                return "; ".join(errors), "loading it failed: " + "; ".join(errors)
            loaded = [line for line in loaded if line]
            if loaded:
                return None, "loaded " + ", ".join(loaded) + ": serving"
            if pipeline == "embedding_demo" and gateway is not None and elsewhere is None:
                return None, load_demo_clip(gateway.url, data_dir / "run" / "gateway_admin_key")
            return None, "nothing to load into Triton"

        builder = BuildBehind(behind, profile, build_state, data_dir / "run" / "build.log", load_pipeline,
                              repository=elsewhere).start()
    while not done.wait(0.5):
        if any(kept.keeper.state == ENDED for kept in servers):  # a server that exited 0 on its own
            break
    if builder is not None:
        builder.stop()  # its trainings too; `make triton` again resumes (the machine's cache keeps what ended)
    code = 1 if gave_up and not signals_seen else 0
    for kept in servers:
        kept.request_stop()
    if gateway_keeper is not None:
        gateway_keeper.request_stop(signal_gateway=False)  # no restart while the gateway stops below
        gateway_keeper.join()
    if gateway is not None:
        if signals_seen and gateway.process is not None:
            # the signal asked it to drain: requests in flight finish (DRAIN_S) before Triton stops
            try:
                gateway.process.wait(float(os.environ.get("DRAIN_S", 25)) + 15)
            except subprocess.TimeoutExpired:
                pass
        gateway.stop()
    stop_all()
    return code
