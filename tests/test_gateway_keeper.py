"""The launcher's gateway keeper (launcher/gateway_process.py GatewayKeeper): a gateway killed with SIGKILL
while the launcher runs is started again on the same port after the backoff; a stop request is never
followed by a restart; a gateway that keeps dying while starting ends in a crash loop that gives up.

`python -m http.server` serving an `openapi.json` stands in for `python -m gateway` (GatewayProcess
waits for that path): the keeper, the process handling and the reaping run unchanged around it. The
real gateway under the real launcher is killed in tests/test_cluster_server.py."""
from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from launcher.gateway_process import GatewayKeeper, GatewayProcess
from launcher.keeper import RestartPolicy
from launcher.processes import free_port


def stand_in(tmp_path, command: list[str] | None = None) -> GatewayProcess:
    (tmp_path / "openapi.json").write_text("{}")
    gateway = GatewayProcess("127.0.0.1:1", port=free_port(), data_dir=tmp_path)
    gateway.command = command or [sys.executable, "-m", "http.server", str(gateway.port), "--bind", "127.0.0.1",
                                  "--directory", str(tmp_path)]
    return gateway


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_a_killed_gateway_is_started_again_on_its_port(tmp_path):
    gateway = stand_in(tmp_path).start(timeout=30)
    keeper = GatewayKeeper(gateway, RestartPolicy(backoff_s=0.2)).start_watching()
    pids = [gateway.process.pid]
    try:
        for _ in range(2):  # twice: the second death is seen as well as the first
            os.kill(gateway.process.pid, signal.SIGKILL)
            wait_for(lambda: len(keeper.restarts) == len(pids) and keeper.restarts[-1].up_at, 30,
                     "the killed gateway was not started again")
            assert gateway.process.pid != pids[-1] and gateway.is_up()
            pids.append(gateway.process.pid)
        assert [r.cause for r in keeper.restarts] == ["killed by SIGKILL"] * 2
        assert all(r.up_at is not None and r.up_at >= r.died_at for r in keeper.restarts)
        assert keeper.failure is None
    finally:
        keeper.request_stop()
        keeper.join()
        gateway.stop()
    assert not any(alive(pid) for pid in pids)


def test_no_restart_after_a_stop_request(tmp_path):
    gateway = stand_in(tmp_path).start(timeout=30)
    keeper = GatewayKeeper(gateway, RestartPolicy(backoff_s=0.1)).start_watching()
    pid = gateway.process.pid
    try:
        keeper.request_stop()  # as the launcher's signal handler: SIGTERM to the gateway, and no restart
        wait_for(lambda: not alive(pid) or gateway.process.poll() is not None, 10, "SIGTERM did not stop it")
        time.sleep(1.0)  # well past the backoff
        assert keeper.restarts == [] and gateway.process is not None and gateway.process.pid == pid
        keeper.join(5)
    finally:
        gateway.stop()


def test_a_crash_loop_gives_up_and_says_why(tmp_path):
    gateway = stand_in(tmp_path).start(timeout=30)
    given_up = []
    keeper = GatewayKeeper(gateway, RestartPolicy(max_restarts=2, window_s=60, backoff_s=0.1),
                           on_give_up=given_up.append).start_watching()
    gateway.command = [sys.executable, "-c", "raise SystemExit(3)"]  # every restart dies while starting
    try:
        os.kill(gateway.process.pid, signal.SIGKILL)
        wait_for(lambda: given_up, 30, "the crash loop did not give up")
    finally:
        keeper.request_stop()
        keeper.join()
        gateway.stop()
    assert keeper.failure == given_up[0]
    assert "gateway crash loop: 2 restarts within 60s" in keeper.failure
    assert "died while starting: exit code 3" in keeper.failure
    assert [r.cause for r in keeper.restarts][0] == "killed by SIGKILL"


@pytest.mark.parametrize("code", [0, 1])
def test_any_exit_while_not_stopping_is_restarted(tmp_path, code):
    """Exit code 0 too: only the launcher decides when its gateway stops."""
    gateway = stand_in(tmp_path).start(timeout=30)
    keeper = GatewayKeeper(gateway, RestartPolicy(backoff_s=0.1)).start_watching()
    first = gateway.process
    try:
        first.send_signal(signal.SIGTERM if code == 0 else signal.SIGKILL)
        wait_for(lambda: keeper.restarts and keeper.restarts[0].up_at, 30, "not restarted")
    finally:
        keeper.request_stop()
        keeper.join()
        gateway.stop()
