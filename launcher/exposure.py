"""Exposure, decided at launch: off loopback, Triton's model-control and shared-memory APIs need an admin
key header, and the gateway needs API keys.

Anyone who can reach an unrestricted Triton can load, unload or override any model and map shared
memory, so `make triton` with a non-loopback HOST restricts them; the gateway and the supervisor send
the key (TRITON_ADMIN_KEY) as the `triton-admin-key` header on load/unload. Loopback is the gateway's
own answer (gateway/loopback.py), so the two never disagree.

The key never goes on Triton's command line, which any local user can read in /proc/<pid>/cmdline (with
it, user `nobody` unlocked model control: issue 56). Triton 2.51 reads the key from its restricted-API
flags alone (no file, no environment variable), so the flags carry KEY_MARK and `key_channel` starts
tritonserver with argv_key.c preloaded, which gives Triton's flag parser the key from the server's own
environment (readable by its user only). Without a C compiler to build that library, the key goes on the
command line as before, with a warning (docs/security.md)."""
from __future__ import annotations

import hashlib
import logging
import os
import secrets
import shutil
import subprocess
from pathlib import Path

from gateway.keys import key_line, new_key
from gateway.loopback import is_loopback
from supervisor.monitor import ADMIN_HEADER

RESTRICTED = "model-repository,shared-memory"
GATEWAY_KEY_ID = "generated-admin"  # the key id of the admin key generated off loopback
KEY_MARK = "@TRITON_ADMIN_KEY@"  # in Triton's flags where the key goes; argv_key.c puts it there
KEY_VARIABLE = "TRITON_ADMIN_KEY"
SHIM_SOURCE = Path(__file__).with_name("argv_key.c")
SHIM_DIR = Path(__file__).resolve().parent.parent / ".artifacts" / "argv_key"  # the user's own, not /tmp
log = logging.getLogger("launcher.exposure")


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


def restricted_api_args() -> list[str]:
    """Triton's restriction flags, KEY_MARK where the key goes: the server's TRITON_ADMIN_KEY, given to
    Triton by `key_channel` when it starts (launcher/triton_server.py)."""
    return [f"--grpc-restricted-protocol={RESTRICTED}:{ADMIN_HEADER}={KEY_MARK}",
            f"--http-restricted-api={RESTRICTED}:{ADMIN_HEADER}={KEY_MARK}"]


def shim_library() -> Path | None:
    """argv_key.c built once per source (a shared library under .artifacts/), or None without a compiler."""
    source = SHIM_SOURCE.read_bytes()
    target = SHIM_DIR / f"argv_key-{hashlib.sha256(source).hexdigest()[:16]}.so"
    if target.is_file():
        return target
    compiler = shutil.which(os.environ.get("CC") or "cc")
    if compiler is None:
        return None
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        SHIM_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)  # a read-only tree: no library, a warning
        subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(partial), str(SHIM_SOURCE), "-ldl"],
                       check=True, capture_output=True, timeout=120)
        os.replace(partial, target)  # whole or absent: servers started at once each build their own
    except (subprocess.SubprocessError, OSError) as exc:
        log.warning("could not build %s: %s", SHIM_SOURCE, getattr(exc, "stderr", b"") or exc)
        partial.unlink(missing_ok=True)
        return None
    return target


def key_channel(command: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """(command, environment) to start tritonserver with: where the command holds KEY_MARK, the environment
    gets argv_key.c in LD_PRELOAD and the command stays without the key. Without the library the key is
    written into the command (readable by any local user), with a warning."""
    if not any(KEY_MARK in arg for arg in command):
        return command, env
    key = env.get(KEY_VARIABLE)
    if not key:
        raise ValueError(f"the restricted-API flags need {KEY_VARIABLE} in tritonserver's environment")
    shim = shim_library()
    if shim is None:
        log.warning("no C compiler (cc) to build %s: Triton's admin key goes on its command line, which any "
                    "local user can read (docs/security.md)", SHIM_SOURCE.name)
        return [arg.replace(KEY_MARK, key) for arg in command], env
    preload = " ".join(p for p in (str(shim), env.get("LD_PRELOAD", "")) if p)
    return command, {**env, "LD_PRELOAD": preload}


# --- the gateway's keys and Triton's own ports (issue 25, docs/security.md) ---


def triton_host(env: dict[str, str] | None = None) -> str:
    """Where Triton's HTTP and gRPC (inference) ports listen: loopback unless TRITON_HOST opts in to
    direct access (inference sent to Triton directly bypasses the gateway's keys and quotas)."""
    env = os.environ if env is None else env
    return env.get("TRITON_HOST") or "127.0.0.1"


def gateway_keys(host: str, data_dir: Path, env: dict[str, str] | None = None) -> tuple[Path | None, Path | None, bool]:
    """(GATEWAY_API_KEYS_FILE for the gateway, file holding a generated plain key, generated now).

    GATEWAY_API_KEYS_FILE when set; none on a loopback HOST (the gateway is open to local callers);
    otherwise an admin key kept in DATA_DIR/run/gateway_admin_key (mode 600, reused across starts) and
    its SHA-256 line in DATA_DIR/run/gateway_api_keys."""
    env = os.environ if env is None else env
    if env.get("GATEWAY_API_KEYS_FILE"):
        return Path(env["GATEWAY_API_KEYS_FILE"]), None, False
    if is_loopback(host):
        return None, None, False
    run = data_dir / "run"
    run.mkdir(parents=True, exist_ok=True)
    key_file, keys_file = run / "gateway_admin_key", run / "gateway_api_keys"
    generated = not (key_file.is_file() and key_file.read_text().strip())
    if generated:
        key_file.unlink(missing_ok=True)
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(new_key() + "\n")
    os.chmod(key_file, 0o600)
    keys_file.write_text("# generated by `make triton` (HOST is not loopback): the key is in gateway_admin_key\n"
                         + key_line(key_file.read_text().strip(), GATEWAY_KEY_ID, "admin"))
    return keys_file, key_file, generated
