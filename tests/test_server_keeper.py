"""launcher/server_keeper.py without Triton: exit causes, backoff, restarts of an abnormal exit, the crash
loop (it gives up naming the last cause and the log), a clean exit and a requested stop not restarted."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from launcher.keeper import CrashLoop, RestartPolicy, describe_exit
from launcher.processes import free_port
from launcher.server_keeper import ServerKeeper
from launcher.service import Service


def test_describe_exit():
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(-signal.SIGABRT) == "aborted (SIGABRT)"
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(137) == "exit code 137 (SIGKILL)"


def test_backoff_doubles_and_a_crash_loop_is_refused():
    policy = RestartPolicy(max_restarts=3, window_s=60, backoff_s=1, max_backoff_s=3)
    assert [policy.next_delay(t) for t in (0, 1, 2)] == [1, 2, 3]
    assert policy.next_delay(3) is None  # a 4th restart within 60 s
    assert policy.next_delay(61) == 3  # the first has left the window: two remain in it


class FakeServer(Service):
    """A TritonServer's surface: each launch runs the next script (a python -c line), on ports of its own."""

    name = "tritonserver"
    poll_s = 0.02

    def __init__(self, scripts: list[str], log_file):
        self.scripts, self.log_file = list(scripts), log_file
        self.process: subprocess.Popen | None = None
        self.starts = self.stops = 0
        self.explicit_models = None
        self.host = self.metrics_host = "127.0.0.1"
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.last_exit_code = None

    def launch(self, append_log=False):
        self.starts += 1
        self.process = subprocess.Popen([sys.executable, "-c", self.scripts.pop(0)])

    def is_up(self):
        return self.process is not None and self.process.poll() is None

    def note_regions(self):
        pass

    def stop(self, timeout=0):
        self.stops += 1
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.last_exit_code = self.process.wait()
        self.process = None


def test_an_abnormal_exit_is_restarted_and_a_stop_is_not(tmp_path):
    server = FakeServer(["import os; os.abort()", "import time; time.sleep(60)"], tmp_path / "log")
    ups = []
    keeper = ServerKeeper(server, RestartPolicy(backoff_s=0.05), on_up=lambda: ups.append(time.time()))
    keeper.start(timeout=10)
    keeper.start_watching()
    deadline = time.monotonic() + 20
    while not ups and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ups and server.starts == 2 and server.process.poll() is None
    assert [r.cause for r in keeper.restarts] == ["aborted (SIGABRT)"] and keeper.restarts[0].ready_at
    keeper.stop()
    assert server.process is None and server.starts == 2  # stopped, not restarted


def test_a_crash_loop_gives_up_naming_the_cause_and_the_log(tmp_path):
    log = tmp_path / "tritonserver.log"
    log.write_text("E1125 something went wrong in the stub\n")
    server = FakeServer(["import time; time.sleep(0.5); raise SystemExit(3)"] + ["import sys; sys.exit(3)"] * 3, log)
    keeper = ServerKeeper(server, RestartPolicy(max_restarts=2, backoff_s=0.01))
    keeper.start(timeout=10)
    with pytest.raises(CrashLoop) as caught:
        keeper.watch()
    message = str(caught.value)
    assert "crash loop" in message and "exit code 3" in message and str(log) in message
    assert "something went wrong in the stub" in message  # the log's last lines
    assert server.starts == 3  # the first start and two restarts


def test_a_clean_exit_is_not_restarted(tmp_path):
    server = FakeServer(["import time; time.sleep(0.5)"], tmp_path / "log")
    keeper = ServerKeeper(server)
    keeper.start(timeout=10)
    assert keeper.watch() == 0 and server.starts == 1


class FailingStart(FakeServer):
    """Its first start dies while starting (answers only from the second launch on)."""

    def is_up(self):
        return self.starts > 1 and super().is_up()


def test_a_server_dying_while_it_starts_is_restarted(tmp_path):
    server = FailingStart(["import os; os.abort()", "import time; time.sleep(60)"], tmp_path / "log")
    keeper = ServerKeeper(server, RestartPolicy(backoff_s=0.01))
    keeper.start()
    assert server.starts == 2 and server.process.poll() is None
    assert keeper.restarts[0].cause == "died while starting: aborted (SIGABRT)"
    keeper.stop()
