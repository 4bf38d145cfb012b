"""Starts the gateway (`python -m gateway`) as a child process against a running Triton: used by
`make triton` (launcher/stack.py) and the test fixtures (free port, always stopped).

`GatewayKeeper` keeps it running under the launcher: a gateway that exits while the launcher is not
stopping (kill -9, an OOM kill, a crash) is started again after a backoff, like tritonserver under
launcher/server_keeper.py (one keeper: launcher/keeper.py); a crash loop gives up. Its API keys off
loopback: launcher/exposure.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from launcher.keeper import Keeper, RestartPolicy
from launcher.paths import ROOT
from launcher.processes import RunRecord, claim_ports, terminate
from launcher.service import Service, answers, spawn


class GatewayProcess(Service):
    name = "gateway"

    def __init__(self, triton_grpc_url: str, host: str = "127.0.0.1", port: int = 8080,
                 data_dir: Path = ROOT / "data", env: dict[str, str] | None = None, log_file: Path | None = None):
        self.host, self.port, self.data_dir, self.log_file = host, port, Path(data_dir), log_file
        self.env = dict(os.environ)
        self.env.update({"TRITON_GRPC_URL": triton_grpc_url, "HOST": host, "GATEWAY_PORT": str(port),
                         "DATA_DIR": str(self.data_dir), "PYTHONPATH": str(ROOT)})
        # no HF_HUB_OFFLINE here: hub downloads of runtime loads are governed by HUB_DOWNLOADS (gateway/hub/);
        # HF_ENDPOINT, HF_TOKEN and HUB_* pass through from the environment
        self.env.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.env.update(env or {})
        self.command = [sys.executable, "-m", "gateway"]
        self.process: subprocess.Popen | None = None
        # which gateway this data folder's launcher started last: one a killed launcher left behind on the port
        # is stopped by the next start (launcher/processes.py claim_ports)
        self.record = RunRecord(self.data_dir / "run" / "gateway.pid")

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def launch(self) -> None:
        """Starts the process without waiting for it to answer, once its port is free: a holder is named
        (PortTaken), or stopped when a previous run of this data folder left it behind."""
        claim_ports(self.host, [self.port], self.record, self.name, say=lambda line: print(line, flush=True))
        self.process = spawn(self.command, self.log_file, cwd=ROOT, env=self.env)
        self.record.write(self.process.pid)

    def is_up(self) -> bool:
        return answers(f"{self.url}/openapi.json")

    def stop(self, timeout: float = 40.0) -> None:
        if self.process is None:
            return
        terminate(self.process, timeout, group=True)  # SIGTERM drains (DRAIN_S) before it exits
        self.process = None


class GatewayKeeper(Keeper):
    """Watches a started GatewayProcess from a thread and starts it again when it exits while no stop was
    requested, whatever its exit status: the launcher is meant to serve a gateway for as long as it runs.

    On a crash loop `failure` is set and `on_give_up(message)` runs (the launcher then stops and exits 1).
    `request_stop()` is safe from a signal handler: it sets the flag and sends SIGTERM (the drain) to the
    current process under the lock, so a restart cannot slip a new process in between."""

    name = prefix = "gateway"
    reap_timeout_s = 5.0  # whatever the dead gateway started in its session
    poll_s = 0.2

    def __init__(self, gateway: GatewayProcess, policy: RestartPolicy | None = None, start_timeout_s: float = 300.0,
                 on_give_up: Callable[[str], None] | None = None):
        super().__init__(gateway, policy, start_timeout_s=start_timeout_s, on_give_up=on_give_up)

    @property
    def gateway(self) -> GatewayProcess:
        return self.service

    def request_stop(self, signal_gateway: bool = True) -> None:
        super().request_stop()
        if signal_gateway:
            with self._lock:
                process = self.gateway.process
                if process is not None and process.poll() is None:
                    process.send_signal(signal.SIGTERM)


