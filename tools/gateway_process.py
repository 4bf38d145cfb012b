"""Starts the gateway (`python -m gateway`) as a child process against a running Triton: used by
`make triton` (tools/triton_launcher.py) and the test fixtures (free port, always stopped)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 300.0) -> "GatewayProcess":
        out = open(self.log_file, "ab") if self.log_file else None
        self.process = subprocess.Popen([sys.executable, "-m", "gateway"], cwd=ROOT, env=self.env,
                                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
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
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self.process = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
