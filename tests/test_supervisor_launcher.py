"""`make triton`'s launcher runs the supervisor: kill -9 a stub under load, the gateway's /health answers 503
naming the model, the launcher logs the events, the model serves again, /health is 200, and the stop
leaves nothing behind (no process, no /dev/shm region, though Triton keeps the old version to the end)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from bench.workload import Load, pipelines
from launcher.paths import ROOT
from launcher.processes import free_port
from supervisor.faults import kill_stub
from supervisor.processes import alive, command_line, process_tree, shm_regions_mapped

pytestmark = pytest.mark.integration


def tritonserver_pid(launcher_pid: int) -> int:
    for pid in process_tree(launcher_pid):
        if (command_line(pid) or ("",))[0].endswith("/tritonserver"):
            return pid
    raise LookupError("no tritonserver under the launcher")


def running(pids: list[int]) -> list[int]:
    """The pids still running: neither gone nor a zombie waiting to be reaped."""
    return [pid for pid in pids if alive(pid)]


def test_launcher_supervisor_heals_and_health_tells_the_truth(tmp_path):
    import tritonclient.grpc as grpcclient

    ports = {"HTTP_PORT": free_port(), "GRPC_PORT": free_port(), "METRICS_PORT": free_port(),
             "GATEWAY_PORT": free_port()}
    env = dict(os.environ, LOAD_MODELS="text_embedding", DATA_DIR=str(tmp_path / "data"), PRELOAD_MODELS="",
               **{k: str(v) for k, v in ports.items()})
    log_path = tmp_path / "launcher.log"
    proc = subprocess.Popen([sys.executable, "-m", "launcher"], env=env, cwd=ROOT,
                            stdout=log_path.open("w"), stderr=subprocess.STDOUT)
    health = httpx.Client(base_url=f"http://127.0.0.1:{ports['GATEWAY_PORT']}", timeout=30)
    try:
        deadline = time.monotonic() + 240
        while "triton: ready" not in log_path.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.5)
        assert health.get("/health").status_code == 200
        tree = process_tree(proc.pid)
        # under load, requests die with the stub: Triton 2.51 then never unloads the old version (its
        # regions stay mapped until the server exits without removing them)
        load = Load(f"127.0.0.1:{ports['GRPC_PORT']}", ["text_embedding"], concurrency=8, timeout_s=30).start()
        time.sleep(2)
        killed_at = time.monotonic()
        kill_stub(tritonserver_pid(proc.pid), "text_embedding_encoder")
        statuses = []
        while time.monotonic() - killed_at < 30:
            response = health.get("/health")
            statuses.append((response.status_code, response.text))
            if response.status_code == 200 and any(code == 503 for code, _ in statuses):
                break
            time.sleep(0.05)
        time.sleep(2)
        load.stop()
        regions = shm_regions_mapped(process_tree(proc.pid))
        unhealthy = [text for code, text in statuses if code == 503]
        assert unhealthy and "text_embedding_encoder" in unhealthy[0] and "text_embedding" in unhealthy[0], statuses[:3]
        assert statuses[-1][0] == 200, statuses[-3:]
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['GRPC_PORT']}")
        client.infer("text_embedding", pipelines()["text_embedding"].good())  # serving again
        output = log_path.read_text()
        for event in ("death detected: text_embedding_encoder", "reload started: text_embedding_encoder",
                      "healed: text_embedding_encoder"):
            assert event in output, output[-2000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0
    finally:
        health.close()
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 10  # killed processes may take a moment to be reaped
    while running(tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not running(tree), "processes outlived the launcher"
    assert regions and not [r for r in regions if os.path.exists(r)], "shared-memory regions outlived the launcher"
