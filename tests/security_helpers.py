"""Shared pieces of the security tests: the keys, a gateway started with a keys file, raw-socket clients."""
from __future__ import annotations

import socket
from pathlib import Path

from gateway.keys import key_line
from launcher.gateway_process import GatewayProcess
from launcher.processes import free_port

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
