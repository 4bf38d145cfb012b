"""Starts the gateway (`python -m gateway`) as a child process against a running Triton: used by
`make triton` (tools/triton_launcher.py) and the test fixtures (free port, always stopped).

`gateway_keys` gives it its API keys (an admin key generated off loopback). `GatewayKeeper` keeps it running under the launcher: a gateway that exits while the launcher is not
stopping (kill -9, an OOM kill, a crash) is started again after a backoff, like tritonserver under
tools/server_keeper.py; a crash loop gives up."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.keys import key_line, new_key
from supervisor.exposure import is_loopback
from tools.triton_server import terminate

ROOT = Path(__file__).resolve().parent.parent
GATEWAY_KEY_ID = "generated-admin"  # the key id of the admin key generated off loopback
log = logging.getLogger("triton.gateway_keeper")


class GatewayProcess:
    def __init__(self, triton_grpc_url: str, host: str = "127.0.0.1", port: int = 8080,
                 data_dir: Path = ROOT / "data", env: dict[str, str] | None = None, log_file: Path | None = None):
        self.host, self.port, self.data_dir, self.log_file = host, port, Path(data_dir), log_file
        self.env = dict(os.environ)
        self.env.update({"TRITON_GRPC_URL": triton_grpc_url, "HOST": host, "GATEWAY_PORT": str(port),
                         "DATA_DIR": str(self.data_dir), "PYTHONPATH": str(ROOT)})
        # no HF_HUB_OFFLINE here: hub downloads of runtime loads are governed by HUB_DOWNLOADS (gateway/hub.py);
        # HF_ENDPOINT, HF_TOKEN and HUB_* pass through from the environment
        self.env.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.env.update(env or {})
        self.command = [sys.executable, "-m", "gateway"]
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def launch(self) -> subprocess.Popen:
        """Starts the process without waiting for it to answer."""
        out = open(self.log_file, "ab") if self.log_file else None
        self.process = subprocess.Popen(self.command, cwd=ROOT, env=self.env,
                                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        if out is not None:
            out.close()  # the child holds its own copy
        return self.process

    def start(self, timeout: float = 300.0) -> "GatewayProcess":
        self.launch()
        try:
            self.wait_up(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def is_up(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/openapi.json", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_up(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited with code {self.process.returncode}"
                                   + (f" (log: {self.log_file})" if self.log_file else ""))
            if self.is_up():
                return
            time.sleep(0.2)
        raise TimeoutError(f"gateway not up after {timeout:.0f}s")

    def stop(self, timeout: float = 40.0) -> None:
        if self.process is None:
            return
        terminate(self.process, timeout, group=True)  # SIGTERM drains (DRAIN_S) before it exits
        self.process = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


@dataclass
class GatewayRestart:
    died_at: float  # unix time the exit was seen
    cause: str
    up_at: float | None = None  # unix time the new gateway answered


class GatewayKeeper:
    """Watches a started GatewayProcess from a thread and starts it again when it exits while no stop was
    requested, whatever its exit status: the launcher is meant to serve a gateway for as long as it runs.

    The backoff and the crash-loop limit are tools/server_keeper.py's RestartPolicy. On a crash loop
    `failure` is set and `on_give_up(message)` runs (the launcher then stops and exits 1).
    `request_stop()` is safe from a signal handler: it sets the flag and sends SIGTERM (the drain) to the
    current process under a lock, so a restart cannot slip a new process in between."""

    def __init__(self, gateway: GatewayProcess, policy=None, start_timeout_s: float = 300.0,
                 on_give_up: Callable[[str], None] | None = None):
        from tools.server_keeper import RestartPolicy

        self.gateway, self.policy = gateway, policy or RestartPolicy()
        self.start_timeout_s, self.on_give_up = start_timeout_s, on_give_up
        self.restarts: list[GatewayRestart] = []
        self.failure: str | None = None
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_stop(self, signal_gateway: bool = True) -> None:
        self._stop.set()
        if signal_gateway:
            with self._lock:
                process = self.gateway.process
                if process is not None and process.poll() is None:
                    process.send_signal(signal.SIGTERM)

    def start_watching(self) -> "GatewayKeeper":
        self._thread = threading.Thread(target=self._run, name="gateway-keeper", daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float = 30.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        from tools.server_keeper import describe_exit

        while not self._stop.is_set():
            process = self.gateway.process
            if process is None:
                return
            code = process.poll()
            if code is None:
                self._stop.wait(0.2)
                continue
            if self._stop.is_set():
                return
            self._restart(describe_exit(code))

    def _restart(self, cause: str) -> None:
        from tools.server_keeper import describe_exit

        while not self._stop.is_set():
            restart = GatewayRestart(time.time(), cause)
            self.restarts.append(restart)
            with self._lock:
                self.gateway.stop(timeout=5)  # reaps: whatever the dead gateway started in its session
            delay = self.policy.next_delay(time.monotonic())
            if delay is None:
                self.failure = (f"gateway crash loop: {self.policy.max_restarts} restarts within "
                                f"{self.policy.window_s:.0f}s; last exit: {cause}")
                log.error("gateway: giving up: %s", self.failure)
                if self.on_give_up:
                    self.on_give_up(self.failure)
                return
            log.warning("gateway: the gateway is down (%s): restarting it in %.1fs on port %d", cause, delay,
                        self.gateway.port)
            if self._stop.wait(delay):
                return
            with self._lock:
                if self._stop.is_set():
                    return
                process = self.gateway.launch()
            started = time.monotonic()
            while not self._stop.is_set():
                if process.poll() is not None:
                    cause = f"died while starting: {describe_exit(process.returncode)}"
                    break
                if self.gateway.is_up():
                    restart.up_at = time.time()
                    log.warning("gateway: restarted, up in %.1fs (pid %d)", time.monotonic() - started, process.pid)
                    return
                if time.monotonic() - started > self.start_timeout_s:
                    cause = f"not up after {self.start_timeout_s:.0f}s while starting"
                    break
                self._stop.wait(0.2)


def gateway_keys(host: str, data_dir: Path, env: dict[str, str] | None = None) -> tuple[Path | None, Path | None, bool]:
    """(GATEWAY_API_KEYS_FILE for the gateway, file holding a generated plain key, generated now).

    GATEWAY_API_KEYS_FILE when set; none on a loopback HOST (the gateway is open to local callers);
    otherwise an admin key kept in DATA_DIR/run/gateway_admin_key (mode 600, reused across starts) and
    its SHA-256 line in DATA_DIR/run/gateway_api_keys."""
    env = os.environ if env is None else env
    if env.get("GATEWAY_API_KEYS_FILE"):
        return Path(env["GATEWAY_API_KEYS_FILE"]), None, False
    if is_loopback(host):
        return None, None, False
    run = data_dir / "run"
    run.mkdir(parents=True, exist_ok=True)
    key_file, keys_file = run / "gateway_admin_key", run / "gateway_api_keys"
    generated = not (key_file.is_file() and key_file.read_text().strip())
    if generated:
        key_file.unlink(missing_ok=True)
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(new_key() + "\n")
    os.chmod(key_file, 0o600)
    keys_file.write_text("# generated by `make triton` (HOST is not loopback): the key is in gateway_admin_key\n"
                         + key_line(key_file.read_text().strip(), GATEWAY_KEY_ID, "admin"))
    return keys_file, key_file, generated
