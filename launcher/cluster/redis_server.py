"""Starts Debian's `redis-server` (deploy/install_tools.sh installs it) for `make cluster` and the tests:
bound to loopback, its append-only file in `data_dir` (what was registered survives a restart), stopped
with SIGTERM (Redis writes its data and exits) and killed if it hangs. With a password (`make cluster`
always gives one: `kept_password`), a client must AUTH first; the password goes to redis-server in a
mode-600 config file, never on its command line (which every local user can read, with ps for one)."""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
from pathlib import Path
from urllib.parse import quote

from launcher.processes import terminate
from launcher.service import Service


def redis_binary() -> str:
    found = shutil.which("redis-server") or ("/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)
    if not found:
        raise FileNotFoundError("redis-server is not installed (deploy/install_tools.sh installs Debian's redis-server)")
    return found


def ping(host: str, port: int, password: str | None = None, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            if password:
                s.sendall(b"AUTH %b\r\n" % password.encode())
                if not s.recv(16).startswith(b"+OK"):
                    return False
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def kept_password(path: Path) -> str:
    """The password kept in `path`, or a new one written there first: the file is created mode 600 (never
    readable by another user, not even for a moment) and kept across starts, like the admin key."""
    path = Path(path)
    try:
        password = path.read_text().strip()
    except FileNotFoundError:
        password = ""
    if not password:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        password = secrets.token_urlsafe(32)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
            out.write(password + "\n")
    os.chmod(path, 0o600)
    return password


class RedisServer(Service):
    name, not_up, poll_s, start_timeout_s = "redis-server", "not answering", 0.05, 30.0

    def __init__(self, port: int, data_dir: Path, host: str = "127.0.0.1", log_file: Path | None = None,
                 password: str | None = None):
        self.host, self.port, self.data_dir = host, port, Path(data_dir)
        self.log_file = log_file or self.data_dir / "redis.log"
        self.password = password
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """What clients use: with the password when there is one (REDIS_URL; never print it)."""
        credentials = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{credentials}{self.host}:{self.port}/0"

    @property
    def public_url(self) -> str:
        """The URL without the password: for messages and cluster.json."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def auth_config(self) -> Path:
        return self.data_dir / "auth.conf"

    def command(self) -> list[str]:
        config = [str(self.auth_config)] if self.password else []  # a config file comes first
        return [redis_binary(), *config, "--port", str(self.port), "--bind", self.host, "--dir", str(self.data_dir),
                "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",  # the AOF is the persistence
                "--daemonize", "no", "--logfile", str(self.log_file), "--pidfile", "",
                # the gateways follow the registry by pub/sub; keyspace events are not needed
                "--notify-keyspace-events", ""]

    def launch(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.password:
            self.auth_config.unlink(missing_ok=True)
            with os.fdopen(os.open(self.auth_config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
                out.write(f"requirepass {self.password}\n")
        self.process = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    def is_up(self) -> bool:
        return ping(self.host, self.port, self.password)

    def stop(self, timeout: float = 20.0) -> None:
        if self.process is None:
            return
        terminate(self.process, timeout)  # Redis writes its data on SIGTERM
        self.process = None
