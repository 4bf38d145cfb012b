"""Issue 43 item 9: `make cluster`'s Redis had no password, so any local user could register models that
every replica then loads with the Triton admin key. Now the cluster generates a password (kept in
DATA_DIR/cluster/redis_password, mode 600, like the gateway's admin key), Redis refuses a client without
it, every replica gets it in REDIS_URL, and it is never printed, written into cluster.json, or put on a
command line (which other local users can read in /proc)."""
from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import sys
import time
from pathlib import Path

import psutil
import pytest

from gateway.keys import ApiKey
from gateway.middleware.quotas import QuotaBook
from gateway.settings import Settings
from launcher.cluster.redis_server import RedisServer, kept_password, ping
from launcher.cluster.stand import Cluster, free_cluster_port
from launcher.processes import free_port

pytestmark = pytest.mark.skipif(not (shutil.which("haproxy") and shutil.which("redis-server")),
                                reason="deploy/install_tools.sh installs haproxy and redis-server")
FAKE = Path(__file__).with_name("fake_launcher.py")


def _raw(port: int, command: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(command)
        return s.recv(256)


def test_the_password_is_generated_once_into_a_mode_600_file(tmp_path):
    path = tmp_path / "cluster" / "redis_password"
    first = kept_password(path)
    assert len(first) >= 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert kept_password(path) == first, "kept across starts (the replicas' REDIS_URL must not change)"
    path.write_text("")
    assert kept_password(path) != first and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_redis_with_a_password_refuses_a_client_without_it(tmp_path):
    server = RedisServer(free_port(), tmp_path / "redis", password="s3cret-pass_word")
    with server:
        assert _raw(server.port, b"PING\r\n").startswith(b"-NOAUTH")
        assert _raw(server.port, b"SET x 1\r\n").startswith(b"-NOAUTH")
        assert not ping(server.host, server.port) and ping(server.host, server.port, "s3cret-pass_word")
        assert "s3cret-pass_word" in server.url and "s3cret-pass_word" not in server.public_url
        assert "s3cret-pass_word" not in " ".join(psutil.Process(server.process.pid).cmdline()), \
            "a command line is readable by every local user"
        config = next(server.data_dir.glob("*.conf"))
        assert stat.S_IMODE(config.stat().st_mode) == 0o600

        key = ApiKey(key_id="k", digest=b"0" * 32, scopes=frozenset({"inference"}), limits={"concurrency": 2})

        async def quotas_work_with_the_credentials():
            book = QuotaBook(Settings(data_dir=tmp_path, redis_url=server.url, quota_storage=server.url))
            try:
                assert (await book.hit(key, "second", 5, "requests"))[0]
                admitted, _, ticket = await book.concurrency.acquire("k", 2)
                assert admitted and not isinstance(ticket, str), "counted in Redis, not by the local fallback"
                assert not book.degraded()
            finally:
                await book.close()
        asyncio.run(quotas_work_with_the_credentials())


def test_make_cluster_gives_its_redis_a_password_and_every_replica_the_url_with_it(tmp_path):
    lines: list[str] = []
    cluster = Cluster(2, free_cluster_port(2), tmp_path / "data", echo=lines.append, start_timeout_s=60)
    cluster.launcher_command = [sys.executable, str(FAKE)]
    cluster.start()
    try:
        password_file = cluster.dir / "redis_password"
        password = password_file.read_text().strip()
        assert password and stat.S_IMODE(password_file.stat().st_mode) == 0o600
        assert _raw(cluster.redis.port, b"PING\r\n").startswith(b"-NOAUTH")
        for replica in cluster.replicas:
            url = cluster._replica_env(replica)["REDIS_URL"]
            assert f":{password}@127.0.0.1:{cluster.redis.port}" in url
            assert psutil.Process(replica.process.pid).environ().get("REDIS_URL") == url
        assert password not in cluster.state_file.read_text()
        assert not [line for line in lines if password in line], "the password is never printed"
        os.kill(cluster.redis.process.pid, 9)  # started again by the keeper, with the same password
        deadline = time.monotonic() + 30
        while not ping(cluster.redis.host, cluster.redis.port, password):
            assert time.monotonic() < deadline, "redis not started again"
            time.sleep(0.1)
        assert _raw(cluster.redis.port, b"PING\r\n").startswith(b"-NOAUTH")
    finally:
        cluster.stop()
