"""DNS rebinding and cross-site requests against a gateway without API keys (issue 43, item 3).

Without GATEWAY_API_KEYS_FILE the gateway listens on loopback only, but a browser on that host reaches it
for any web page: a page whose name the attacker re-points at 127.0.0.1 (DNS rebinding) sends
`Host: rebind.attacker.example`, and a page of any site can send simple cross-site POSTs (its `Origin`
says where it came from). Either could load, unload and delete models and start hub downloads. So an open
gateway serves only requests whose Host is a loopback name (127.0.0.1, any 127.x address, localhost,
[::1], any port) or one listed in ALLOWED_HOSTS, and whose Origin, when a browser sends one, is such a
name too; anything else gets 403 saying why. A request without Host (HTTP/1.0, a load balancer's probe)
comes from no browser and is served. With keys, the keys are the protection and nothing here applies."""
from __future__ import annotations

from gateway import errors
from gateway.loopback import is_loopback
from gateway.middleware.log_fields import printable

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
HINT = ("this gateway runs without API keys, so it serves only loopback names (127.0.0.1, localhost, [::1]) "
        "and those in ALLOWED_HOSTS, against DNS rebinding and cross-site requests (docs/security.md)")


def host_name(value: str) -> str:
    """The name of a Host header or an Origin's authority, without its port: 'LocalHost:8080' -> 'localhost',
    '[::1]:8080' -> '[::1]'."""
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value.partition("]")
        return name + "]" if bracket and (rest == "" or (rest[0] == ":" and rest[1:].isdigit())) else value
    name, colon, port = value.rpartition(":")
    return name if colon and port.isdigit() else value


class LocalOrigin:
    """Which Host and Origin values an open gateway serves; `refusal` runs on every request (a few us)."""

    def __init__(self, allowed_hosts: tuple[str, ...] = (), port: int | None = None):
        self.names = frozenset([*LOOPBACK_NAMES, *(host_name(h) for h in allowed_hosts)])
        # the exact header values of the common case, so that they cost one set lookup
        self.exact = frozenset(v.encode() for n in self.names for v in (n, f"{n}:{port}" if port else n))
        self.exact_origins = frozenset(scheme + v for scheme in (b"http://", b"https://") for v in self.exact)

    def allows_host(self, value: str) -> bool:
        name = host_name(value)
        if name in self.names:
            return True
        return name.startswith("[") == name.endswith("]") and is_loopback(name)  # no half-bracketed '[::1

    def allows_origin(self, value: str) -> bool:
        scheme, sep, authority = value.strip().partition("://")
        return bool(sep) and scheme.lower() in ("http", "https") and "/" not in authority \
            and self.allows_host(authority)

    def refusal(self, headers) -> errors.Forbidden | None:
        host = origin = None
        for name, value in headers:
            if name == b"host":
                host = value
            elif name == b"origin":
                origin = value
        if host is not None and host not in self.exact and not self.allows_host(host.decode("latin-1")):
            return errors.Forbidden(f"Host '{printable(host.decode('latin-1'), 256)}' is not served: {HINT}",
                                    code="host_not_allowed")
        if origin is not None and origin not in self.exact_origins \
                and not self.allows_origin(origin.decode("latin-1")):
            return errors.Forbidden(f"requests from pages of Origin '{printable(origin.decode('latin-1'), 256)}' "
                                    f"are not served: {HINT}", code="origin_not_allowed")
        return None
