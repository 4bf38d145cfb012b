"""launcher/cluster/ with the real redis-server and HAProxy, and tests/fake_launcher.py in place of the
replica launchers (a second each instead of a Triton start): the generated HAProxy config passes
`haproxy -c`; the load balancer spreads requests over both replicas; a launcher that exits cleanly is
started again at once, one killed with SIGKILL after its orphans are killed and a backoff; the rolling
restart drains each replica in HAProxy before it signals it and puts it back; a second cluster on the
same data dir is refused; the stop leaves no process, state file or socket. The real replicas:
tests/test_cluster_server.py."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from launcher.cluster.haproxy import BACKEND, haproxy_config
from launcher.cluster.rolling import rolling_restart
from launcher.cluster.stand import Cluster, free_cluster_port
from launcher.cluster.state import read_state
from supervisor.processes import alive

pytestmark = pytest.mark.skipif(not (shutil.which("haproxy") and shutil.which("redis-server")),
                                reason="deploy/install_tools.sh installs haproxy and redis-server")
FAKE = Path(__file__).with_name("fake_launcher.py")


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return value


def test_the_generated_config_is_valid_haproxy(tmp_path):
    config = tmp_path / "haproxy.cfg"
    config.write_text(haproxy_config("127.0.0.1", 8090, [("replica-0", "127.0.0.1", 8091),
                                                         ("replica-1", "127.0.0.1", 8092)], tmp_path / "s.sock",
                                     source="127.0.0.1", client_connections=256))
    check = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    text = config.read_text()
    assert "option httpchk GET /health" in text and "inter 1s" in text
    assert "retry-on conn-failure empty-response 503" in text and "option redispatch 1" in text
    # registrations and writes are never repeated after they may have reached a gateway
    assert "http-request disable-l7-retry unless repeatable" in text
    assert "server replica-1 127.0.0.1:8092 check" in text
    # the gateways learn each client's address from HAProxy, which connects from the address they trust
    # and caps one address's connections itself (tests/test_cluster_client_address.py)
    assert "send-proxy-v2" in text and "    source 127.0.0.1\n" in text
    assert "tcp-request connection reject if { sc0_conn_cur gt 256 }" in text


def test_the_replicas_trust_haproxy_and_share_its_per_client_cap(tmp_path):
    c = Cluster(2, 18090, tmp_path / "data", env={"MAX_CONNECTIONS_PER_CLIENT": "40"}, echo=lambda line: None)
    assert c._replica_env(c.replicas[0])["TRUSTED_PROXIES"] == c.balancer.source == "127.0.0.1"
    assert c.balancer.client_connections == 40
    assert Cluster(1, 18090, tmp_path / "data", env={"MAX_CONNECTIONS": "400"}).balancer.client_connections == 100


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(2, free_cluster_port(2), tmp_path / "data", echo=lambda line: None, start_timeout_s=60)
    c.launcher_command = [sys.executable, str(FAKE)]
    for replica in c.replicas:  # fast restarts for the test
        replica.policy.backoff_s = 0.5
    c.start()
    try:
        yield c
    finally:
        c.stop()


def test_requests_reach_every_replica_and_the_state_file_names_them(cluster):
    with httpx.Client(base_url=cluster.url, timeout=10) as http:
        seen = {http.get("/health").headers["x-replica-id"] for _ in range(6)}
    assert seen == {"replica-0", "replica-1"}
    state = read_state(cluster.dir)
    assert state["pid"] == os.getpid() and state["backend"] == BACKEND
    assert [r["pid"] for r in state["replicas"]] == [r.process.pid for r in cluster.replicas]
    assert cluster.admin.servers().keys() == {"replica-0", "replica-1"}


def test_a_second_cluster_on_the_same_data_dir_is_refused(cluster):
    other = Cluster(1, free_cluster_port(1), cluster.dir.parent, echo=lambda line: None)
    with pytest.raises(RuntimeError, match="already runs"):
        other.start()
    assert cluster.admin.socket_path.exists() and cluster.state_file.exists()  # the running one untouched


def test_launchers_that_exit_are_started_again(cluster):
    clean, killed = cluster.replicas
    clean_pid, killed_pid = clean.process.pid, killed.process.pid
    cluster._note()  # as the keeper does every few seconds: the killed launcher's child is known
    orphan = [pid for pid in killed.seen if pid != killed_pid][0]
    os.kill(clean_pid, signal.SIGTERM)
    os.kill(killed_pid, signal.SIGKILL)
    wait_for(lambda: clean.process.pid != clean_pid and killed.process.pid != killed_pid, 30, "not restarted")
    assert [cause for _, cause in clean.exits] == ["exit code 0"]
    assert [cause for _, cause in killed.exits] == ["killed by SIGKILL"]
    assert not alive(orphan), "the killed launcher's child was left running"
    wait_for(lambda: read_state(cluster.dir)["replicas"][1]["pid"] == killed.process.pid, 10, "state not updated")
    for replica in cluster.replicas:
        cluster.admin.wait(replica.name, lambda row: row.get("status") == "UP", 30, "not UP again")


def test_haproxy_and_redis_are_started_again(cluster):
    from launcher.cluster.redis_server import ping

    haproxy_pid, redis_pid = cluster.haproxy.pid, cluster.redis.process.pid
    os.kill(haproxy_pid, signal.SIGKILL)
    os.kill(redis_pid, signal.SIGKILL)
    # the state file names the new HAProxy once it answers on its socket
    wait_for(lambda: read_state(cluster.dir)["haproxy_pid"] not in (None, haproxy_pid), 30, "haproxy not started again")
    wait_for(lambda: cluster.redis.process and cluster.redis.process.pid != redis_pid, 30, "redis not started again")
    assert ping(cluster.redis.host, cluster.redis.port, cluster.redis.password)
    for replica in cluster.replicas:
        cluster.admin.wait(replica.name, lambda row: row.get("status") == "UP", 30, "not UP behind the new haproxy")
    assert httpx.get(f"{cluster.url}/health", timeout=10).status_code == 200
    assert read_state(cluster.dir)["haproxy_pid"] == cluster.haproxy.pid and not alive(haproxy_pid)


def test_rolling_restart_drains_each_replica_first(cluster, monkeypatch):
    before = [r.process.pid for r in cluster.replicas]
    states = []
    real_set_state = type(cluster.admin).set_state

    def recording(admin, server, state):
        if state == "drain":  # the replica is still running when it leaves HAProxy
            states.append((server, state, alive(read_state(cluster.dir)["replicas"][int(server[-1])]["pid"])))
        else:
            states.append((server, state, True))
        real_set_state(admin, server, state)

    monkeypatch.setattr(type(cluster.admin), "set_state", recording)
    records = rolling_restart(cluster.dir, cluster.port, up_timeout_s=60, echo=lambda line: None)
    assert [(r["replica"], r["old_pid"]) for r in records] == [("replica-0", before[0]), ("replica-1", before[1])]
    assert [r.process.pid for r in cluster.replicas] == [r["new_pid"] for r in records]
    assert states == [("replica-0", "drain", True), ("replica-0", "ready", True),
                      ("replica-1", "drain", True), ("replica-1", "ready", True)]
    assert {row["status"] for row in cluster.admin.servers().values()} == {"UP"}


def test_rolling_without_a_cluster_says_so(tmp_path):
    with pytest.raises(RuntimeError, match="no running cluster"):
        rolling_restart(tmp_path / "cluster")


def test_stop_leaves_nothing(tmp_path):
    cluster = Cluster(2, free_cluster_port(2), tmp_path / "data", echo=lambda line: None, start_timeout_s=60)
    cluster.launcher_command = [sys.executable, str(FAKE)]
    cluster.start()
    cluster._note()
    pids = [pid for r in cluster.replicas for pid in r.seen] + [cluster.haproxy.pid, cluster.redis.process.pid]
    assert len(pids) == 6
    cluster.stop()
    assert not [pid for pid in pids if alive(pid)]
    assert not cluster.state_file.exists() and not cluster.admin.socket_path.exists()
    assert (cluster.dir / "redis").is_dir()  # the data stays
