"""A tritonserver that aborts (SIGABRT, as Triton 2.51 does after some stub deaths) while codegen's stubs are
mid-call: the keeper reaps everything the dead server left (the stubs that outlived it, its /dev/shm regions, its
ports), and its FIRST restart serves. Its line states the outage from the death to serving again.

Own tritonserver (this test kills it)."""
from __future__ import annotations

import logging
import os
import re
import signal
import time

import pytest

from bench.workload import Load
from launcher.processes import free_port
from launcher.server_keeper import SupervisedServer
from launcher.triton_server import TritonServer
from supervisor.monitor import Supervisor
from supervisor.processes import alive, process_group

pytestmark = pytest.mark.integration


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return value


def test_an_abort_with_stubs_mid_call_is_served_again_by_the_first_restart(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="launcher.keeper")
    server = TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          explicit_models=["codegen_generator", "codegen", "codegen_stream"],
                          log_file=tmp_path / "tritonserver.log")
    kept = SupervisedServer(server, lambda s: Supervisor(lambda: s.process and s.process.pid, s.grpc_url,
                                                         tmp_path / "supervisor.json")).start(timeout=300)
    load = None
    try:
        load = Load(server.grpc_url, ["codegen", "codegen_stream"], concurrency=8, timeout_s=30).start()
        wait_for(lambda: len([o for o in load.outcomes if o.error is None]) >= 8, 120, "codegen never served")
        pid = server.process.pid
        group = process_group(pid)
        assert len(group) > 1  # the server and its stubs, busy with the load's calls
        aborted = time.time()
        os.kill(pid, signal.SIGABRT)
        restart = wait_for(lambda: next((r for r in kept.restarts if r.died_at > aborted and r.ready_at), None), 180,
                           "not served again within 180 s")
        served = wait_for(lambda: next((o for o in load.outcomes if o.start > restart.ready_at and o.error is None),
                                       None), 60, "no codegen request answered after the restart")
    finally:
        if load is not None:
            load.stop(5)
        kept.stop()
    after = [r for r in kept.restarts if r.died_at > aborted]
    assert [r.cause for r in after] == ["aborted (SIGABRT)"] and restart.tries == 1, [r.cause for r in after]
    assert not [member for member in group if alive(member)]
    lines = [record.getMessage() for record in caplog.records]
    reaped = next(line for line in lines if line.startswith(f"triton: reaped the dead tritonserver (pid {pid})"))
    assert re.search(r": [1-9]\d* of its processes still alive, \d+ /dev/shm regions removed, ports free$",
                     reaped), reaped
    serving = next(line for line in lines if "serving again" in line)
    assert re.search(r"down from [\d:.]+ to [\d:.]+, [\d.]+s, 1 restart tried; this start took [\d.]+s$", serving)
    print(f"\nSIGABRT under codegen load: {reaped}\n  {serving}\n  death seen {restart.died_at - aborted:.1f}s "
          f"after the signal (Triton symbolizes its stack first); first answer {served.end - aborted:.1f}s after it")
