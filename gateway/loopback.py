"""Is a bind address loopback? One answer for the gateway (open gateway, hub downloads) and the launcher
(Triton's exposure checks), so the two never disagree about what "only reachable from this host" means."""
from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback IPs (`127.0.0.0/8`, `::1`, also written `[::1]`).

    "" is not loopback: an empty HOST binds every address."""
    host = host.strip().strip("[]").lower()
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
