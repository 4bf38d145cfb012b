"""The launcher's Ctrl-C handling in-process (issue 35, item 8): a Ctrl-C during start-up ends without a
traceback, and a second Ctrl-C after the server's process group is gone does not raise ProcessLookupError
out of os.killpg (which skipped the gateway's stop and the /dev/shm clean-up). `sleep` stands in for
tritonserver: the launcher's own main(), signal handler and TritonServer run unchanged around it.

Not collected by itself (no test_ prefix): tests/test_launcher_signals.py runs each scenario in an interpreter of
its own. These scenarios signal their own process, and a test process that has loaded native libraries before them
no longer handles a signal as a fresh one does: OpenVINO's CPU plugin swaps the calling thread's alternate signal
stack while a Core lives (its AMX set-up), and CPython runs its signal handlers on that stack. In the full suite
on CI the first SIGINT here killed pytest itself (SIGSEGV, no faulthandler output) after in-process engine tests."""
from __future__ import annotations

import os
import signal
import sys
import threading

import pytest

from launcher.processes import free_port
from launcher.triton_server import TritonServer
from launcher import stack as triton_launcher


@pytest.fixture
def launcher(monkeypatch, tmp_path):
    """main() over a `sleep` server: returns a function that runs it and the calls to TritonServer.stop."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setenv("SUPERVISOR_STATE_FILE", str(tmp_path / "unused"))
    monkeypatch.delenv("TRITON_RESTRICT_API", raising=False)
    monkeypatch.setattr(sys, "argv", ["triton_launcher.py", "--no-gateway", "--load-models", "text_embedding",
                                      "--data-dir", str(tmp_path / "data"), "--http-port", str(free_port()),
                                      "--grpc-port", str(free_port()), "--metrics-port", str(free_port())])
    monkeypatch.setattr(TritonServer, "command", lambda self: ["sleep", "120"])
    stops = []
    real_stop = TritonServer.stop
    monkeypatch.setattr(TritonServer, "stop", lambda self, *a, **k: (stops.append(1), real_stop(self, *a, **k))[1])
    try:
        yield triton_launcher.main, stops
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_a_ctrl_c_during_start_up_stops_without_a_traceback(launcher, monkeypatch):
    main, stops = launcher
    real_wait_ready, pids = TritonServer.wait_ready, []

    def ctrl_c_while_waiting(self, timeout):  # the server runs, not yet ready
        pids.append(self.process.pid)
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        return real_wait_ready(self, timeout)

    monkeypatch.setattr(TritonServer, "wait_ready", ctrl_c_while_waiting)
    assert main() == 0  # before the fix: RuntimeError("tritonserver exited with code -15") out of main
    assert stops, "the server was not stopped"
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)


def test_a_second_ctrl_c_after_the_server_is_gone_still_lets_the_clean_up_run(launcher, monkeypatch):
    main, stops = launcher
    monkeypatch.setattr(TritonServer, "wait_ready", lambda self, timeout: None)
    from supervisor.monitor import Supervisor

    real_stop = Supervisor.stop
    pids = []

    def stop_after_a_second_ctrl_c(self):
        # the server (and its process group) has exited after the first Ctrl-C: the impatient second one
        os.kill(os.getpid(), signal.SIGINT)
        real_stop(self)

    monkeypatch.setattr(Supervisor, "stop", stop_after_a_second_ctrl_c)
    from launcher.server_keeper import ServerKeeper

    real_watch = ServerKeeper.watch  # the launcher waits on the server through its keeper (issue 26)
    monkeypatch.setattr(ServerKeeper, "watch", lambda self, *a, **k: (pids.append(self.server.process.pid),
                                                                        os.kill(os.getpid(), signal.SIGINT),
                                                                        real_watch(self, *a, **k))[2])
    assert main() == 0  # before the fix: ProcessLookupError out of the handler, and no server.stop()
    assert stops, "the clean-up (server.stop: stubs and /dev/shm regions) did not run"
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)
