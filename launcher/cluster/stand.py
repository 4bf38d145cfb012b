"""The Cluster: Redis, the replicas' launchers and HAProxy started in that order, kept running from one loop
(one keeper each: launcher/keeper.py), and stopped with the replicas draining first.

The replica launchers are kept running: one that exits while the cluster is not stopping is started again
(at once after a clean exit, as after cluster-rolling's SIGTERM; with backoff after a crash; a crash loop
leaves that replica down and says so). Redis and HAProxy are started again at once, as they were (same
port, same configuration). Docs: docs/cluster.md."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from gateway.loopback import is_loopback
from gateway.server.http_protocol import client_cap
from gateway.settings import Settings
from launcher.cluster.haproxy import BACKEND, HAProxy
from launcher.cluster.probe import client_host, http_status
from launcher.cluster.redis_server import RedisServer, kept_password
from launcher.cluster.replicas import Replica, ReplicaKeeper, reap, server_name
from launcher.cluster.state import owner_alive, read_state, write_state
from launcher.keeper import RUNNING, Keeper, RestartPolicy
from launcher.paths import ROOT
from launcher.processes import free_port, kill_tree, port_free
from launcher.service import StartStop, spawn
from supervisor.processes import start_time


class Interrupted(RuntimeError):
    pass


class Cluster(StartStop):
    """Redis + `replicas` launchers + HAProxy; `start()` returns once every replica's /health is 200 and
    HAProxy has each server UP; `stop()` stops them all (the replicas drain first) and removes what the
    cluster wrote that is not data: the state file, the stats socket, /dev/shm regions left behind."""

    def __init__(self, replicas: int = 2, port: int = 8090, data_dir: Path = ROOT / "data",
                 models: list[str] | None = None, host: str = "127.0.0.1", redis_port: int | None = None,
                 env: dict[str, str] | None = None, start_timeout_s: float = 900.0, echo=print):
        if replicas < 1:
            raise ValueError("REPLICAS must be at least 1")
        self.port, self.host, self.models = port, host, models
        self.dir = Path(data_dir).resolve() / "cluster"
        self.env, self.start_timeout_s, self.echo = dict(env or {}), start_timeout_s, echo
        self.redis = RedisServer(redis_port or free_port(), self.dir / "redis")
        self.replicas = [Replica(i, port + 1 + i, free_port(), free_port(), free_port(), self.dir / server_name(i))
                         for i in range(replicas)]
        address = client_host(self.host)  # where the gateways listen (HOST), as a client reaches it
        # HAProxy connects from that address too, and the gateways believe its PROXY headers (TRUSTED_PROXIES)
        self.balancer = HAProxy(self.host, self.port, [(r.name, address, r.gateway_port) for r in self.replicas],
                                self.dir, source=address, client_connections=self._client_connections())
        self.admin = self.balancer.admin
        self.launcher_command = [sys.executable, "-m", "launcher"]
        self.redis_keeper, self.haproxy_keeper = (Keeper(service, RestartPolicy.at_once(), say=echo, name=name,
                                                         prefix="cluster")
                                                  for service, name in ((self.redis, "redis"), (self.balancer, "haproxy")))
        self.keepers = [self.redis_keeper, self.haproxy_keeper]
        self.keepers += [ReplicaKeeper(replica, self._launch, echo) for replica in self.replicas]
        self._stopping = threading.Event()
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None

    def _client_connections(self) -> int:
        """One client address's connections at HAProxy: the gateways' MAX_CONNECTIONS_PER_CLIENT (0: no cap)."""
        return client_cap(Settings.from_env({**os.environ, **self.env}))

    # -- addresses
    @property
    def url(self) -> str:
        return f"http://{client_host(self.host)}:{self.port}"

    def replica_url(self, index: int) -> str:
        return f"http://{client_host(self.host)}:{self.replicas[index].gateway_port}"

    @property
    def state_file(self) -> Path:
        return self.dir / "cluster.json"

    @property
    def password_file(self) -> Path:
        """Redis's password (mode 600, kept across starts); every replica gets it in REDIS_URL."""
        return self.dir / "redis_password"

    @property
    def haproxy(self) -> subprocess.Popen | None:
        return self.balancer.process

    # -- start
    def start(self) -> "Cluster":
        self._check_can_start()
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            # only who can read this file (mode 600) may use the registry that every replica loads from
            self.redis.password = kept_password(self.password_file)
            self.redis.start()
            self.echo(f"cluster: redis {self.redis.public_url} (data {self.redis.data_dir}; password in "
                      f"{self.password_file}, mode 600)")
            for replica in self.replicas:
                self._launch(replica)
            self._write_state()
            self._thread = threading.Thread(target=self._keep, name="cluster-keeper", daemon=True)
            self._thread.start()
            self.balancer.start()
            self.echo(f"cluster: haproxy on {self.url} (config {self.balancer.config})")
            self._write_state()
            deadline = time.monotonic() + self.start_timeout_s
            for replica in self.replicas:
                self._wait(lambda r=replica: http_status(f"{self.replica_url(r.index)}/health") == 200, deadline,
                           f"{replica.name}: /health not 200 (log: {replica.log_file})", replica)
                self.echo(f"cluster: {replica.name} ready on {self.replica_url(replica.index)}")
            for replica in self.replicas:
                self.admin.wait(replica.name, lambda row: row.get("status") == "UP",
                                max(5.0, deadline - time.monotonic()), "not UP in haproxy")
        except BaseException:
            self.stop()
            raise
        return self

    def _check_can_start(self) -> None:
        state = read_state(self.dir)
        if owner_alive(state):
            raise RuntimeError(f"a cluster already runs on {self.dir} (pid {state['pid']}, port {state['port']}): "
                               "stop it first (Ctrl-C in its terminal)")
        if not is_loopback(self.host) and not (self.env.get("GATEWAY_API_KEYS_FILE")
                                               or os.environ.get("GATEWAY_API_KEYS_FILE")):
            raise RuntimeError(f"HOST={self.host} is not loopback: set GATEWAY_API_KEYS_FILE to one keys file for "
                               "every replica (docs/security.md); each launcher would otherwise make its own key")
        if len(str(self.admin.socket_path)) > 100:
            raise RuntimeError(f"{self.dir}: too long a path for HAProxy's unix socket (108 bytes at most)")
        taken = [p for p in [self.port] + [r.gateway_port for r in self.replicas] if not port_free(self.host, p)]
        if taken:
            raise RuntimeError(f"port(s) {taken} already in use on {self.host}: CLUSTER_PORT and the next "
                               f"{len(self.replicas)} ports are the cluster's")

    def _replica_env(self, replica: Replica) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env)
        env.update({"HOST": self.host, "HTTP_PORT": str(replica.http_port), "GRPC_PORT": str(replica.grpc_port),
                    "METRICS_PORT": str(replica.metrics_port), "GATEWAY_PORT": str(replica.gateway_port),
                    "DATA_DIR": str(replica.data_dir), "REPLICA_ID": replica.name, "REDIS_URL": self.redis.url,
                    "TRUSTED_PROXIES": self.balancer.source, "PYTHONUNBUFFERED": "1"})
        # a replica's codegen server (launcher/domains.py), when it has one, on ports of its own too
        env.update({f"CODEGEN_{kind}_PORT": str(free_port()) for kind in ("HTTP", "GRPC", "METRICS")})
        if self.models:
            env["LOAD_MODELS"] = ",".join(self.models)
        return env

    def _launch(self, replica: Replica) -> None:
        replica.data_dir.mkdir(parents=True, exist_ok=True)
        replica.process = spawn(self.launcher_command, replica.log_file, cwd=ROOT, env=self._replica_env(replica))
        replica.seen[replica.process.pid] = start_time(replica.process.pid)

    def _wait(self, predicate, deadline: float, what: str, replica: Replica | None = None) -> None:
        while not predicate():
            if self._stopping.is_set():
                raise Interrupted("stopped while starting")
            if replica is not None and replica.given_up:
                raise RuntimeError(replica.given_up)
            if time.monotonic() > deadline:
                raise TimeoutError(what)
            time.sleep(0.5)

    # -- keeping everything running
    def _keep(self) -> None:
        last_note = 0.0
        while not self._stopping.wait(0.25):
            with self._lock:
                if self._stopping.is_set():
                    return
                changed = False
                for keeper in self.keepers:
                    changed |= keeper.step()
                if changed:
                    self._write_state()
            if time.monotonic() - last_note > 3:
                self._note()
                last_note = time.monotonic()

    def _note(self) -> None:
        """Processes and /dev/shm regions of the replicas: what a reaping removes if they are left."""
        for replica in self.replicas:
            replica.note()

    def _write_state(self) -> None:
        write_state(self.dir, {
            "pid": os.getpid(), "pid_start": start_time(os.getpid()), "host": self.host, "port": self.port,
            "backend": BACKEND, "socket": str(self.admin.socket_path), "redis_url": self.redis.public_url,
            "drain_s": self._drain_s(), "haproxy_pid": self._haproxy_pid(),
            "replicas": [{"index": r.index, "name": r.name, "pid": r.process.pid if r.process else None,
                          "gateway_port": r.gateway_port, "http_port": r.http_port, "grpc_port": r.grpc_port,
                          "metrics_port": r.metrics_port, "data_dir": str(r.data_dir),
                          "log": str(r.log_file), "given_up": r.given_up} for r in self.replicas]})

    def _haproxy_pid(self) -> int | None:
        """HAProxy's pid once it answers on its stats socket: a restarted one is named only when
        `make cluster-rolling` (which reads this file) can drive it."""
        return self.haproxy.pid if self.haproxy is not None and self.haproxy_keeper.state == RUNNING else None

    def _drain_s(self) -> float:
        return float(self.env.get("DRAIN_S", os.environ.get("DRAIN_S", 25)))

    # -- stop
    def request_stop(self) -> None:
        """Safe from a signal handler: no restart from now on; a start in progress ends (Interrupted)."""
        self._stopping.set()
        for keeper in self.keepers:
            keeper.request_stop()

    def stop(self, timeout: float | None = None) -> None:
        self.request_stop()
        if self._thread is not None:
            self._thread.join(10)
        with self._lock:
            self._note()
            timeout = timeout or self._drain_s() + 90  # the launcher: gateway drain + 15 s, then Triton's stop
            running = [r.process for r in self.replicas if r.process is not None and r.process.poll() is None]
            for process in running:
                process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for process in running:
                try:
                    process.wait(max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.echo(f"cluster: launcher {process.pid} did not stop in {timeout:.0f}s: killing its processes")
                    kill_tree(process.pid)
                    process.wait()
            self.balancer.stop()
            self.redis.stop()
            for replica in self.replicas:  # the last sweep: what a launcher killed above left
                reap(replica)
            self.admin.socket_path.unlink(missing_ok=True)
            if read_state(self.dir).get("pid") == os.getpid():
                self.state_file.unlink(missing_ok=True)
            self.state_file.with_suffix(".tmp").unlink(missing_ok=True)

    def force_stop(self) -> None:
        """A second Ctrl-C: kill every process of the cluster now."""
        self.request_stop()
        for replica in self.replicas:
            if replica.process is not None:
                kill_tree(replica.process.pid)
        for process in (self.haproxy, self.redis.process):
            if process is not None and process.poll() is None:
                process.kill()


def free_cluster_port(replicas: int, host: str = "127.0.0.1") -> int:
    """A CLUSTER_PORT whose next `replicas` ports are free too (tests, bench)."""
    for _ in range(200):
        port = free_port()
        if port + replicas < 65536 and all(port_free(host, port + 1 + i) for i in range(replicas)):
            return port
    raise RuntimeError(f"no run of {replicas + 1} free ports found")
