"""One Triton process per failure domain under `make triton`'s launcher (issue 54), through the gateway:

- the codegen generator's stub killed, then the codegen server aborted (SIGABRT, what Triton 2.51 does by
  itself after a stub's death), while embeddings clients run: no embeddings request fails, and codegen serves
  again (its keeper restarts that server alone);
- the reverse: the encoders' server killed while completions stream: the streams that had started finish,
  new completions are served throughout, and the embeddings serve again after the restart.

One launcher for the module, in the default TRITON_DOMAINS (encoders,codegen), with text_embedding and the
codegen pipelines. The figures are printed (`pytest -s`)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx
import psutil
import pytest

from bench.domains import Clients
from launcher.paths import ROOT
from launcher.processes import free_port
from supervisor.faults import kill_stub
from supervisor.processes import alive, command_line, process_tree, shm_regions_mapped
from test_server_restart import MINILM, wait_for
from test_supervisor_launcher import running

pytestmark = pytest.mark.integration
PORTS = ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT", "CODEGEN_HTTP_PORT", "CODEGEN_GRPC_PORT", "CODEGEN_METRICS_PORT",
         "GATEWAY_PORT")


@dataclass
class Stack:
    launcher: subprocess.Popen
    ports: dict[str, int]
    log: "os.PathLike"
    http: httpx.Client = field(default=None)

    def server_pid(self, port_variable: str) -> int:
        """The tritonserver listening on that gRPC port, found in the launcher's tree."""
        flag = f"--grpc-port={self.ports[port_variable]}"
        for pid in process_tree(self.launcher.pid):
            argv = command_line(pid) or ("",)
            if argv[0].endswith("/tritonserver") and flag in argv:
                return pid
        raise LookupError(f"no tritonserver with {flag} under the launcher")

    def output(self) -> str:
        return self.log.read_text()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    folder = tmp_path_factory.mktemp("domains")
    ports = {name: free_port() for name in PORTS}
    env = dict(os.environ, DATA_DIR=str(folder / "data"), PRELOAD_MODELS="", HF_ENDPOINT="http://127.0.0.1:9",
               LOAD_MODELS="text_embedding,codegen_generator,codegen,codegen_stream", PYTHONUNBUFFERED="1",
               **{k: str(v) for k, v in ports.items()})
    env.pop("TRITON_DOMAINS", None)  # the default: one server per domain
    log = folder / "launcher.log"
    launcher = subprocess.Popen([sys.executable, "-m", "launcher"], env=env, cwd=ROOT, stdout=log.open("w"),
                                stderr=subprocess.STDOUT)
    kept = Stack(launcher, ports, log, httpx.Client(base_url=f"http://127.0.0.1:{ports['GATEWAY_PORT']}", timeout=120))
    try:
        wait_for(lambda: "triton: ready" in log.read_text() or launcher.poll() is not None, 600, "never ready")
        assert launcher.poll() is None, log.read_text()[-3000:]
        wait_for(lambda: kept.http.get("/health").status_code == 200, 120, "gateway never healthy")
        assert kept.http.get("/health").json()["servers"] == {"encoders": "live", "codegen": "live"}
        yield kept
    finally:
        tree = process_tree(launcher.pid)
        regions = shm_regions_mapped(tree)
        launcher.send_signal(signal.SIGTERM)
        try:
            code = launcher.wait(timeout=120)
        except subprocess.TimeoutExpired:
            launcher.kill()
            raise
        kept.http.close()
        assert code == 0, log.read_text()[-3000:]
        assert not running(tree), "processes outlived the launcher"
        assert not [r for r in regions if os.path.exists(r)], "shared-memory regions outlived the launcher"


def embed(http: httpx.Client) -> tuple[int, str]:
    r = http.post("/v1/embeddings", json={"model": MINILM, "input": ["a steady load sentence"]})
    return r.status_code, "" if r.status_code == 200 else r.text[:300]


def complete(http: httpx.Client) -> tuple[int, str]:
    r = http.post("/v1/completions", json={"model": "codegen", "prompt": "def add(a, b):", "max_tokens": 4})
    return r.status_code, "" if r.status_code == 200 else r.text[:300]


def stream(http: httpx.Client) -> tuple[int, str]:
    """A streamed completion: 200 only when it ended with [DONE] and no error event; 'started' once the first
    chunk came (the detail of a failure says whether it had)."""
    started = False
    with http.stream("POST", "/v1/completions", json={"model": "codegen", "prompt": "def fib(n):",
                                                       "max_tokens": 16, "stream": True}) as r:
        if r.status_code != 200:
            return r.status_code, r.read().decode()[:300]
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                return 200, ""
            if "error" in json.loads(data):
                return 599, f"error event (started: {started}): {data[:300]}"
            started = True
    return 598, f"ended without [DONE] (started: {started})"


def health_sample(http: httpx.Client) -> tuple[int, str]:
    r = http.get("/health")
    time.sleep(0.2)  # a probe's pace
    return r.status_code, r.text


def served_again(stack: Stack, call, after: float, within_s: float) -> float:
    """The time of the first success of `call` sent after `after`."""
    def ok():
        start = time.time()
        try:
            return start if call(stack.http)[0] == 200 and start > after else None
        except httpx.HTTPError:
            return None
    return wait_for(ok, within_s, f"not served again within {within_s:.0f}s", every=0.5) - after


def yields_the_cpu(pid: int) -> tuple[int, str]:
    """(the server's nice value, its session's autogroup line, '' where the kernel has none)."""
    try:
        autogroup = open(f"/proc/{pid}/autogroup").read().strip()
    except OSError:
        autogroup = ""
    return psutil.Process(pid).nice(), autogroup


def test_the_codegen_server_yields_the_cpu_to_the_encoders(stack):
    """CODEGEN_NICE (default 5): the codegen server and its stubs run below the encoders', process and session
    (autogroup) alike, so that a burst of generations leaves the encoders the cores (launcher/domains.py)."""
    codegen, encoders = yields_the_cpu(stack.server_pid("CODEGEN_GRPC_PORT")), yields_the_cpu(stack.server_pid("GRPC_PORT"))
    assert codegen[0] == 5 and encoders[0] == 0, (codegen, encoders)
    if codegen[1]:
        assert codegen[1].endswith(" nice 5") and encoders[1].endswith(" nice 0"), (codegen, encoders)
    generator = next(p for p in psutil.Process(stack.server_pid("CODEGEN_GRPC_PORT")).children()
                     if "codegen_generator" in " ".join(p.cmdline()))
    assert generator.nice() == 5, "the stubs inherit it"


def test_codegen_faults_never_reach_the_embeddings(stack):
    encoders_pid = stack.server_pid("GRPC_PORT")
    assert complete(stack.http)[0] == 200 and embed(stack.http)[0] == 200
    clients = Clients(str(stack.http.base_url), embed, 4).start()
    health = Clients(str(stack.http.base_url), health_sample, 1).start()
    figures = []
    try:
        wait_for(lambda: len(clients.calls) >= 8, 60, "no embeddings answered before the kills")
        killed_at = time.time()
        kill_stub(stack.server_pid("CODEGEN_GRPC_PORT"), "codegen_generator")
        figures.append(("generator stub SIGKILL", served_again(stack, complete, killed_at, 120)))
        codegen_pid = stack.server_pid("CODEGEN_GRPC_PORT")
        aborted_at = time.time()
        os.kill(codegen_pid, signal.SIGABRT)
        wait_for(lambda: not alive(codegen_pid), 60, "the codegen server outlived its SIGABRT")  # its backtrace first
        figures.append(("codegen server SIGABRT", served_again(stack, complete, aborted_at, 180)))
        time.sleep(2)
    finally:
        clients.stop()
        health.stop()
    output = stack.output()
    assert "tritonserver (codegen) is down (aborted (SIGABRT))" in output, output[-3000:]
    # /health while the codegen server was down: 200, the server named under `degraded` (a load balancer keeps
    # sending the embeddings), `servers` saying which is down
    samples = [(o.status, json.loads(o.detail)) for o in health.calls if o.detail.startswith("{")]
    down = [(status, body) for status, body in samples if body.get("servers", {}).get("codegen") == "not live"]
    assert down, "no /health sample saw the codegen server down"
    assert all(status == 200 and body["servers"]["encoders"] == "live" and "triton_codegen" in body["degraded"]
               for status, body in down), down[:3]
    assert stack.server_pid("GRPC_PORT") == encoders_pid, "the encoders' server was restarted too"
    assert yields_the_cpu(stack.server_pid("CODEGEN_GRPC_PORT"))[0] == 5, "the restarted codegen server yields too"
    during = [o for o in clients.calls if o.start >= killed_at]
    print(f"\n{len(during)} embeddings requests during the codegen faults, "
          f"{len(clients.failed())} failed, slowest {max(o.end - o.start for o in during):.2f}s; codegen served again: "
          + ", ".join(f"{what} {s:.1f}s" for what, s in figures))
    assert during and not clients.failed(), clients.failed()[:3]


def test_an_encoders_crash_lets_completions_stream_on(stack):
    assert embed(stack.http)[0] == 200
    streams = Clients(str(stack.http.base_url), stream, 3).start()
    unary = Clients(str(stack.http.base_url), complete, 2).start()
    try:
        wait_for(lambda: len([o for o in streams.calls if o.status == 200]) >= 3, 120, "no stream before the kill")
        killed_at = time.time()
        encoders_pid = stack.server_pid("GRPC_PORT")
        os.kill(encoders_pid, signal.SIGKILL)
        wait_for(lambda: not alive(encoders_pid), 60, "the encoders' server outlived its SIGKILL")
        back_s = served_again(stack, embed, killed_at, 240)
        time.sleep(2)
    finally:
        streams.stop()
        unary.stop()
    assert "tritonserver is down (killed by SIGKILL)" in stack.output()
    across = [o for o in streams.calls if o.start < killed_at < o.end]
    during = [o for o in streams.calls + unary.calls if killed_at < o.start < killed_at + back_s]
    print(f"\nencoders' server SIGKILL: embeddings served again after {back_s:.1f}s; {len(across)} streams across "
          f"the kill, {len(during)} completions started while it was down; failed: "
          f"{len(streams.failed()) + len(unary.failed())}")
    assert during, "no completion was sent while the encoders' server was down"
    assert not streams.failed() and not unary.failed(), (streams.failed() + unary.failed())[:3]
