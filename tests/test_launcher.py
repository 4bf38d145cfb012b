"""`make triton`'s launcher: ready on the requested ports, and SIGTERM / Ctrl-C leave nothing behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from launcher.paths import ROOT
from launcher.processes import free_port
from supervisor.processes import alive, process_tree, shm_regions_mapped

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_launcher_serves_then_stops_cleanly(sig, tmp_path):
    ports = {"HTTP_PORT": free_port(), "GRPC_PORT": free_port(), "METRICS_PORT": free_port(),
             "GATEWAY_PORT": free_port()}
    env = dict(os.environ, LOAD_MODELS="text_embedding", DATA_DIR=str(tmp_path / "data"),
               **{k: str(v) for k, v in ports.items()})
    log = (tmp_path / "launcher.log").open("w+")
    proc = subprocess.Popen([sys.executable, "-m", "launcher"], cwd=ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while "triton: ready" not in (tmp_path / "launcher.log").read_text():
            assert proc.poll() is None, (tmp_path / "launcher.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "launcher never became ready"
            time.sleep(0.5)
        output = (tmp_path / "launcher.log").read_text()
        assert f"127.0.0.1:{ports['GRPC_PORT']}" in output and f"127.0.0.1:{ports['HTTP_PORT']}" in output
        assert f"127.0.0.1:{ports['GATEWAY_PORT']}" in output
        # issue 32: on a machine without a usable GPU, one line says so and that Triton's CUDA lines are expected
        from launcher.cpu_notice import cpu_notice, cuda_devices

        notice = cpu_notice(*cuda_devices())
        if notice is None:
            assert "serving on CPU" not in output
        else:
            assert notice in output.splitlines()
            # Triton's own log goes to the file the launcher names; the messages the line explains are there
            server_log = tmp_path / "data" / "run" / "tritonserver.log"
            assert f"triton: server log {server_log}" in output
            assert "CudaDriverHelper" in server_log.read_text(errors="replace")
        server_and_stubs = process_tree(proc.pid)[1:]
        assert len(server_and_stubs) >= 5, "the gateway, tritonserver and the text_embedding stubs should be running"
        # this launcher's regions (other servers on the box, the session's or a neighbour's, make their own)
        regions = shm_regions_mapped(server_and_stubs)
        assert regions, "the stubs should map their shared-memory regions"
        proc.send_signal(sig)
        assert proc.wait(timeout=90) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not [p for p in server_and_stubs if alive(p)], "server or stub processes outlived the launcher"
    assert not [r for r in regions if os.path.exists(r)], "shared-memory regions left in /dev/shm"
