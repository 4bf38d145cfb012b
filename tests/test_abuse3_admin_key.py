"""Issue 56 item 9: Triton's admin key is never on a command line (/proc/<pid>/cmdline is world-readable:
user `nobody` read it and unlocked model control). Triton 2.51 takes the key only inside its restriction
flags, so the flags carry a mark and launcher/argv_key.c, preloaded, hands Triton's flag parser the key from
the server's environment (launcher/exposure.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from launcher import exposure
from launcher.exposure import KEY_MARK, key_channel, restricted_api_args
from launcher.paths import ROOT
from launcher.processes import free_port
from launcher.triton_server import TritonServer
from supervisor.monitor import admin_headers
from supervisor.processes import command_line, process_tree

KEY = "abuse3-admin-key-4711-not-on-any-command-line"


def test_the_restriction_flags_carry_a_mark_and_the_environment_the_key():
    args = restricted_api_args()
    assert all(KEY_MARK in arg for arg in args) and not any(KEY in arg for arg in args)
    command, env = key_channel(["tritonserver", *args], {"TRITON_ADMIN_KEY": KEY, "LD_PRELOAD": "/other.so"})
    assert command == ["tritonserver", *args]
    shim, other = env["LD_PRELOAD"].split(" ")
    assert shim.endswith(".so") and other == "/other.so" and env["TRITON_ADMIN_KEY"] == KEY
    assert key_channel(["tritonserver"], {}) == (["tritonserver"], {})  # unrestricted: nothing to do
    with pytest.raises(ValueError, match="TRITON_ADMIN_KEY"):
        key_channel(["tritonserver", *args], {})


def test_without_a_compiler_the_key_goes_on_the_command_line_with_a_warning(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(exposure, "SHIM_DIR", tmp_path / "none-built-here")
    monkeypatch.setenv("CC", "no-such-compiler-abuse3")
    command, env = key_channel(["tritonserver", *restricted_api_args()], {"TRITON_ADMIN_KEY": KEY})
    assert all(KEY in arg for arg in command[1:]) and "LD_PRELOAD" not in env
    assert "command line" in caplog.text


def _http_index(server, headers: dict) -> int:
    request = urllib.request.Request(f"http://{server.http_url}/v2/repository/index", data=b"{}", headers=headers,
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.integration
def test_a_restricted_server_holds_the_key_on_no_command_line(tmp_path):
    with TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(), explicit_models=[],
                      log_file=tmp_path / "tritonserver.log", extra_args=restricted_api_args(),
                      env={"TRITON_ADMIN_KEY": KEY}) as server:
        cmdlines = []
        for process in psutil.process_iter(["cmdline"]):
            cmdlines.append(" ".join(process.info["cmdline"] or ()))
        assert not [line for line in cmdlines if KEY in line]
        assert any(KEY_MARK in line for line in cmdlines)  # the server's own, with the mark
        # and the key still locks model control, over HTTP and gRPC
        assert _http_index(server, {}) == 403
        assert _http_index(server, {"triton-admin-key": KEY_MARK}) == 403
        assert _http_index(server, {"triton-admin-key": KEY}) == 200
        client = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException):
            client.get_model_repository_index()
        assert client.get_model_repository_index(headers=admin_headers(KEY), as_json=True) is not None


@pytest.mark.integration
def test_a_started_restricted_stack_holds_the_key_on_no_command_line(tmp_path):
    """`make triton` with TRITON_RESTRICT_API=1: launcher, tritonserver, its stubs and the gateway."""
    ports = {"HTTP_PORT": free_port(), "GRPC_PORT": free_port(), "METRICS_PORT": free_port(),
             "GATEWAY_PORT": free_port()}
    env = dict(os.environ, LOAD_MODELS="text_embedding_pooling", DATA_DIR=str(tmp_path / "data"),
               TRITON_RESTRICT_API="1", TRITON_ADMIN_KEY=KEY, **{k: str(v) for k, v in ports.items()})
    log = tmp_path / "launcher.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "launcher"], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while "triton: ready" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the stack never became ready"
            time.sleep(0.5)
        stack = process_tree(proc.pid)
        assert len(stack) >= 3, "the launcher, the gateway, tritonserver and its stub"
        lines = {pid: " ".join(command_line(pid) or ()) for pid in stack}
        assert not [line for line in lines.values() if KEY in line], lines
        assert not [p.pid for p in psutil.process_iter(["cmdline"]) if KEY in " ".join(p.info["cmdline"] or ())]
        assert KEY not in log.read_text()
        server = TritonServer(http_port=ports["HTTP_PORT"])  # only to name the stack's HTTP address
        assert _http_index(server, {}) == 403 and _http_index(server, {"triton-admin-key": KEY}) == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
