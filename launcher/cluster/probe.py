"""How the cluster reaches its gateways: the address a client uses for a bind host, and a URL's status."""
from __future__ import annotations

import urllib.error
import urllib.request


def client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def http_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None
