"""`make triton` (`python -m launcher`): Triton (launcher/triton_server.py), restarted when it crashes
(launcher/server_keeper.py), its supervisor, and the gateway (launcher/gateway_process.py, restarted when
it dies), in the foreground; Ctrl-C / SIGTERM drain the gateway and stop everything cleanly. The image's
CMD and the Kustomize pod's `triton` container (`--no-gateway`) run the same.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from gateway.loopback import is_loopback
from gateway.telemetry.config import traces_url
from launcher.cpu_notice import cpu_notice, cuda_devices
from launcher.exposure import admin_key, gateway_keys, restricted_api_args, restriction_required, triton_host
from launcher.gateway_process import GatewayKeeper, GatewayProcess
from launcher.keeper import CrashLoop, RestartPolicy
from launcher.paths import ROOT
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
        args.extra = restricted_api_args(key) + args.extra
        print(f"triton: HOST={args.host} is not loopback: model control and shared memory need the "
              f"'triton-admin-key' header" + (f" (generated key in {data_dir / 'run' / 'triton_admin_key'})"
                                               if generated else " (TRITON_ADMIN_KEY)"), flush=True)
    return key


def main() -> int:
    args = arguments()
    data_dir = args.data_dir.resolve()
    logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)  # the supervisor's events

    state_file = data_dir / "run" / "supervisor.json"  # the supervisor writes it, the gateway's /health reads it
    os.environ[STATE_FILE_VARIABLE] = str(state_file)  # Triton's stubs inherit it too (the codegen fronts)
    # Triton's inference ports stay on loopback (only the gateway, with its keys, faces HOST) unless
    # TRITON_HOST opts in to direct access; its metrics follow HOST for scrapers (docs/security.md)
    bind = triton_host()
    key = apply_exposure(args, data_dir, bind)
    # Explicit model control: the shipped pipelines load at start; only the gateway loads and unloads others.
    server = TritonServer(bind, args.http_port, args.grpc_port, args.metrics_port, extra_args=args.extra,
                          explicit_models=[m for m in args.load_models.split(",") if m] or shipped_models(), extra_repositories=[data_dir / "triton_models"],
                          metrics_host=args.host, log_file=args.server_log or data_dir / "run" / "tritonserver.log",
                          traces_url=traces_url())  # the gateway inherits the OTEL_* variables and traces the same way
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
        # the gateway loads its runtime models again itself (gateway/triton/server_watch.py): the shipped pipelines
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
