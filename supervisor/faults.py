"""Fault injection shared by the fault tests and the soak: kill -9 a model's stub."""
from __future__ import annotations

import os
import signal

from supervisor.stubs import by_instance, of_model, scan_stub_pids


def kill_stub(server_pid: int, model: str) -> int:
    """SIGKILL the newest stub of `model`'s first instance; returns its pid."""
    stubs = by_instance(of_model(scan_stub_pids(server_pid), model))
    if not stubs:
        raise LookupError(f"no stub of '{model}' under server pid {server_pid}")
    pid = stubs[sorted(stubs)[0]]
    os.kill(pid, signal.SIGKILL)
    return pid
