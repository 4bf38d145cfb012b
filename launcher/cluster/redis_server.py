"""Starts Debian's `redis-server` (deploy/install_tools.sh installs it) for `make cluster` and the tests:
bound to loopback, its append-only file in `data_dir` (what was registered survives a restart), stopped
with SIGTERM (Redis writes its data and exits) and killed if it hangs."""
from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

from launcher.processes import terminate
from launcher.service import Service


def redis_binary() -> str:
    found = shutil.which("redis-server") or ("/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)
    if not found:
        raise FileNotFoundError("redis-server is not installed (deploy/install_tools.sh installs Debian's redis-server)")
    return found


def ping(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer(Service):
    name, not_up, poll_s, start_timeout_s = "redis-server", "not answering", 0.05, 30.0

    def __init__(self, port: int, data_dir: Path, host: str = "127.0.0.1", log_file: Path | None = None):
        self.host, self.port, self.data_dir = host, port, Path(data_dir)
        self.log_file = log_file or self.data_dir / "redis.log"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def command(self) -> list[str]:
        return [redis_binary(), "--port", str(self.port), "--bind", self.host, "--dir", str(self.data_dir),
                "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",  # the AOF is the persistence
                "--daemonize", "no", "--logfile", str(self.log_file), "--pidfile", "",
                # the gateways follow the registry by pub/sub; keyspace events are not needed
                "--notify-keyspace-events", ""]

    def launch(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    def is_up(self) -> bool:
        return ping(self.host, self.port)

    def stop(self, timeout: float = 20.0) -> None:
        if self.process is None:
            return
        terminate(self.process, timeout)  # Redis writes its data on SIGTERM
        self.process = None
