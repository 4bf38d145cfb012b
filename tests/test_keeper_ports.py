"""A start that finds its port taken (launcher/processes.py claim_ports, used by every Triton and gateway start):
it names the holder; it stops the holder only when a previous run of the same data folder left it behind (the
launcher that started it is gone), never a live run's or a stranger's."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from launcher.processes import PortTaken, RunRecord, claim_ports, free_port, port_free
from supervisor.processes import alive, listeners

LISTEN = ("import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); "
          "time.sleep(120)")


def wait_listening(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not listeners(port):
        assert time.monotonic() < deadline, f"nothing listens on {port}"
        time.sleep(0.05)


def left_behind(record_path, port: int, launcher_lives: bool) -> tuple[subprocess.Popen, int]:
    """A 'launcher' that starts a listener in a session of its own, records it as this data folder's, and then
    exits (killed, as a launcher SIGKILLed would) or lives on (a live run). Returns it and the listener's pid."""
    script = textwrap.dedent(f"""
        import subprocess, sys, time
        from launcher.processes import RunRecord
        child = subprocess.Popen([sys.executable, "-c", {LISTEN!r}, "{port}"], start_new_session=True)
        RunRecord({str(record_path)!r}).write(child.pid)
        print(child.pid, flush=True)
        time.sleep(120 if {launcher_lives} else 0)
    """)
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pid = int(launcher.stdout.readline())
    if not launcher_lives:
        launcher.wait(30)
    wait_listening(port)
    return launcher, pid


def kill(*pids: int) -> None:
    for pid in pids:
        subprocess.run(["kill", "-9", str(pid)], check=False, capture_output=True)


def test_a_holder_left_behind_by_a_previous_run_of_the_data_folder_is_stopped(tmp_path):
    port, record = free_port(), RunRecord(tmp_path / "run" / "gateway.pid")
    launcher, holder = left_behind(record.path, port, launcher_lives=False)
    lines = []
    try:
        claim_ports("127.0.0.1", [port], record, "gateway", say=lines.append)
        assert port_free("127.0.0.1", port) and not alive(holder)
        assert f"pid {holder}" in lines[0] and "left behind by a previous run of this data folder" in lines[0]
    finally:
        kill(holder)


def test_a_holder_whose_launcher_still_runs_is_named_and_left_alone(tmp_path):
    port, record = free_port(), RunRecord(tmp_path / "run" / "gateway.pid")
    launcher, holder = left_behind(record.path, port, launcher_lives=True)
    try:
        with pytest.raises(PortTaken, match=rf"gateway: port {port} is taken by pid {holder} \(.*python.*\)"):
            claim_ports("127.0.0.1", [port], record, "gateway", say=lambda line: None)
        assert alive(holder)
    finally:
        kill(holder, launcher.pid)
        launcher.wait(10)


def test_a_stranger_on_the_port_is_named_and_left_alone(tmp_path):
    port = free_port()
    stranger = subprocess.Popen([sys.executable, "-c", LISTEN, str(port)])
    try:
        wait_listening(port)
        with pytest.raises(PortTaken, match=rf"tritonserver: port {port} is taken by pid {stranger.pid} "):
            claim_ports("127.0.0.1", [port], RunRecord(tmp_path / "run" / "tritonserver.pid"), "tritonserver")
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_a_free_port_is_claimed_without_a_word(tmp_path):
    lines = []
    claim_ports("127.0.0.1", [free_port()], RunRecord(tmp_path / "none.pid"), "gateway", say=lines.append)
    assert lines == []
