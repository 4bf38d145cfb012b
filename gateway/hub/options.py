"""Whether a runtime load may download from the hub, and within which bounds: HUB_DOWNLOADS (`off`, `on`,
or an allowlist of organisations / ids; its default is `on` when loading needs a key or the gateway
listens on loopback) and the other hub settings of one load (HubOptions)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from gateway import errors
from gateway.loopback import is_loopback

ROOT = Path(__file__).resolve().parent.parent.parent

ORG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_ON, _OFF = {"on", "1", "true", "yes"}, {"off", "0", "false", "no"}
DEFAULT_MAX_BYTES = 5_000_000_000  # 5 GB


@dataclass(frozen=True)
class HubOptions:
    downloads: str = "off"  # "off" | "on" | "allowlist"
    allowlist: tuple[str, ...] = ()  # lower-case organisations ("intfloat") or ids ("intfloat/e5-small-v2")
    max_bytes: int = DEFAULT_MAX_BYTES
    allow_pickle: bool = False
    timeout_s: float = 1800.0  # one repository's whole download
    metadata_timeout_s: float = 30.0  # one metadata request
    cache_dir: Path = ROOT / "data" / "hub_cache"
    endpoint: str | None = None  # HF_ENDPOINT; None: huggingface_hub's default
    token: str | None = field(default=None, repr=False)  # HF_TOKEN

    @property
    def setting(self) -> str:
        """HUB_DOWNLOADS as it is in effect (for messages and the log)."""
        return ",".join(self.allowlist) if self.downloads == "allowlist" else self.downloads


def default_downloads(host: str, keys_configured: bool) -> str:
    """HUB_DOWNLOADS when it is not set: `on` when loading a model needs a key (`keys_configured`: the
    gateway's API keys are configured) or when the gateway listens on loopback only; otherwise `off`, so
    an exposed gateway without keys never downloads on a stranger's request."""
    return "on" if keys_configured or is_loopback(host) else "off"


def parse_downloads(value: str | None, default: str) -> tuple[str, tuple[str, ...]]:
    """HUB_DOWNLOADS -> (mode, allowlist). Anything unusable is refused at start, naming the variable."""
    value = (value or "").strip()
    if not value:
        value = default
    word = value.lower()
    if word in _ON:
        return "on", ()
    if word in _OFF:
        return "off", ()
    entries = tuple(dict.fromkeys(e.strip().lower() for e in value.split(",") if e.strip()))
    bad = [e for e in entries if not (ORG.match(e) or HUB_ID.match(e))]
    if bad or not entries:
        raise ValueError(f"HUB_DOWNLOADS must be off, on, or a comma-separated list of hub organisations or ids "
                         f"(org or org/name), not {value!r}")
    return "allowlist", entries


def check_allowed(repo_id: str, options: HubOptions) -> None:
    if options.downloads == "on":
        return
    if options.downloads == "off":
        raise errors.HubDownloadsOff(
            f"model '{repo_id}' is not in the download cache and hub downloads are off (HUB_DOWNLOADS=off): "
            "set HUB_DOWNLOADS=on, or to an allowlist that names it, or put the model in a folder under MODEL_ROOTS")
    org = repo_id.split("/", 1)[0].lower()
    if repo_id.lower() not in options.allowlist and org not in options.allowlist:
        raise errors.HubNotAllowed(
            f"model '{repo_id}' is not on the hub download allowlist (HUB_DOWNLOADS={options.setting}): "
            f"add '{org}' or '{repo_id}' to it")
