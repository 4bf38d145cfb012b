"""Loaded by every client process of tests/clients/ (this folder is first on its PYTHONPATH): sockets may
reach 127.0.0.1 / ::1 / localhost only. Any other name lookup or connection fails at once and is written
to the file CLIENTS_BLOCKED_LOG names, so the tier proves that the documented settings need nothing from
outside (tiktoken's encodings, LiteLLM's model-cost map, NLTK data) instead of relying on its absence."""
import os
import socket

LOOPBACK = {"127.0.0.1", "::1", "localhost"}
_log = os.environ.get("CLIENTS_BLOCKED_LOG")
_getaddrinfo, _connect, _connect_ex = socket.getaddrinfo, socket.socket.connect, socket.socket.connect_ex


def _blocked(what: str):
    if _log:
        with open(_log, "a", encoding="utf-8") as log:
            log.write(what + "\n")
    return OSError(f"tests/clients: no network beyond loopback ({what})")


def _host(address) -> str:
    return str(address[0]) if isinstance(address, tuple) else str(address)


def getaddrinfo(host, *args, **kwargs):
    name = host.decode() if isinstance(host, bytes) else str(host)
    if name not in LOOPBACK and not name.startswith("127."):
        raise socket.gaierror(socket.EAI_NONAME, str(_blocked(f"lookup {name}")))
    return _getaddrinfo(host, *args, **kwargs)


def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        host = _host(address)
        if host not in LOOPBACK and not host.startswith("127."):
            raise _blocked(f"connect {host}")
    return _connect(self, address)


def connect_ex(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        host = _host(address)
        if host not in LOOPBACK and not host.startswith("127."):
            _blocked(f"connect {host}")
            return 111  # ECONNREFUSED
    return _connect_ex(self, address)


socket.getaddrinfo = getaddrinfo
socket.socket.connect = connect
socket.socket.connect_ex = connect_ex
