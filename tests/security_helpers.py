"""Shared pieces of the security tests: the keys, a gateway started with a keys file, raw-socket clients."""
from __future__ import annotations

import contextlib
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from gateway.keys import key_line
from launcher.gateway_process import GatewayProcess
from launcher.processes import free_port, terminate
from launcher.service import spawn

ROOT = Path(__file__).resolve().parent.parent

KEYS = {"inference": "gk-test-inference-0123456789", "admin": "gk-test-admin-0123456789",
        "limited": "gk-test-limited-0123456789", "other": "gk-test-other-0123456789",
        "tokens": "gk-test-tokens-0123456789"}
UNKNOWN = "gk-not-a-configured-key"


def write_keys(path: Path) -> Path:
    path.write_text("# test keys: sha256 only\n\n"
                    + key_line(KEYS["inference"], "inference-1", "inference")
                    + key_line(KEYS["admin"], "admin-1", "admin")
                    + key_line(KEYS["limited"], "limited-1", "inference", rps=10)
                    + key_line(KEYS["other"], "other-1", "inference")
                    + key_line(KEYS["tokens"], "tokens-1", "inference", tpm=100))
    return path


def wait_for_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


@contextlib.contextmanager
def fake_triton_server(directory: Path):
    """bench/fake_triton.py on a free port (answers at once: no tritonserver needed); `.grpc_url`."""
    port = free_port()
    process = spawn([sys.executable, str(ROOT / "bench" / "fake_triton.py"), "--port", str(port)],
                    directory / "fake_triton.log", cwd=ROOT)
    try:
        wait_for_port(port)
        yield SimpleNamespace(grpc_url=f"127.0.0.1:{port}")
    finally:
        terminate(process, 10, group=True)


def keyed_gateway(triton, tmp: Path, **env: str) -> GatewayProcess:
    """A gateway on a free port in front of the session's Triton, with the test keys, its own DATA_DIR."""
    keys = write_keys(tmp / "gateway_api_keys")
    data = tmp / "data"
    data.mkdir(exist_ok=True)
    process = GatewayProcess(triton.grpc_url, port=free_port(), data_dir=data, log_file=tmp / "gateway.log",
                             env={"GATEWAY_API_KEYS_FILE": str(keys), "HF_ENDPOINT": "http://127.0.0.1:9", **env})
    return process.start(timeout=180)


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def status_of(sock: socket.socket) -> int:
    """The status code of the first response on `sock` (reads its first line only)."""
    line = b""
    while not line.endswith(b"\r\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError(f"closed before a status line (got {line!r})")
        line += chunk
    return int(line.split()[1])
