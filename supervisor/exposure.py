"""Exposure: off loopback, Triton's model-control and shared-memory APIs need an admin key header.

Anyone who can reach an unrestricted Triton can load, unload or override any model and map shared
memory, so `make triton` with a non-loopback HOST restricts them; the gateway and the supervisor send
the key (TRITON_ADMIN_KEY) as the `triton-admin-key` header on load/unload."""
from __future__ import annotations

import ipaddress
import os
import secrets
from pathlib import Path

from supervisor.monitor import ADMIN_HEADER

RESTRICTED = "model-repository,shared-memory"


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"  # "" binds every address
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def restriction_required(host: str, env: dict[str, str] | None = None) -> bool:
    """Non-loopback HOST, or TRITON_RESTRICT_API=1 (used by tests to check the flags on 127.0.0.1)."""
    env = os.environ if env is None else env
    return not is_loopback(host) or env.get("TRITON_RESTRICT_API") == "1"


def admin_key(key_file: Path, env: dict[str, str] | None = None) -> tuple[str, bool]:
    """TRITON_ADMIN_KEY, or a generated key kept in key_file (mode 600): (key, generated)."""
    env = os.environ if env is None else env
    if env.get("TRITON_ADMIN_KEY"):
        return env["TRITON_ADMIN_KEY"], False
    key_file.parent.mkdir(parents=True, exist_ok=True)
    if key_file.is_file() and key_file.read_text().strip():
        return key_file.read_text().strip(), True
    key = secrets.token_urlsafe(32)
    key_file.touch(mode=0o600)
    key_file.write_text(key)
    return key, True


def restricted_api_args(key: str) -> list[str]:
    return [f"--grpc-restricted-protocol={RESTRICTED}:{ADMIN_HEADER}={key}",
            f"--http-restricted-api={RESTRICTED}:{ADMIN_HEADER}={key}"]


# --- the gateway's keys and Triton's own ports (issue 25, docs/security.md) ---


def triton_host(env: dict[str, str] | None = None) -> str:
    """Where Triton's HTTP and gRPC (inference) ports listen: loopback unless TRITON_HOST opts in to
    direct access (inference sent to Triton directly bypasses the gateway's keys and quotas)."""
    env = os.environ if env is None else env
    return env.get("TRITON_HOST") or "127.0.0.1"
