"""The PROXY protocol, version 2 (HAProxy's `send-proxy-v2`, https://www.haproxy.org/download/2.6/doc/proxy-protocol.txt):
the binary header a proxy writes at the start of each connection to name the client it stands for. The
gateway believes it only from TRUSTED_PROXIES (gateway/server/http_protocol.py), so that behind
`make cluster`'s HAProxy the per-address caps (MAX_CONNECTIONS_PER_CLIENT, a client address's share of
BODY_BUFFER_BYTES) count each real client, not the proxy. From any other peer the header is not read: it
is not HTTP, so the request is refused (400) and counted under the peer's own address.

Plain code, no I/O: `parse` reads what has arrived so far."""
from __future__ import annotations

import ipaddress
import socket
import struct

SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
HEADER = 16  # signature, version and command, family and transport, length of the address block
# the address block of TCP over IPv6 is 36 bytes; the rest is TLVs (none unless proxy-v2-options asks):
# a header longer than this is refused rather than buffered
MAX_BLOCK = 1024
LOCAL, PROXY = 0x0, 0x1  # commands: LOCAL is the proxy's own connection (a health check)
ADDRESSES = {0x1: (socket.AF_INET, 4), 0x2: (socket.AF_INET6, 16)}  # family -> (family, address size)


class ProxyHeaderError(ValueError):
    """The connection began with the signature but the rest is not a valid version 2 header."""


def parse(data: bytes) -> tuple[int, tuple[str, int] | None] | None:
    """What the start of a trusted connection says: None while more bytes are needed to tell; else
    (bytes the header took, the client's (address, port)), the address None where the header names no
    client (LOCAL, or an address family other than TCP/UDP over IPv4/IPv6), and (0, None) when the
    connection does not begin with a header (a plain HTTP request, e.g. a direct health check)."""
    if data[:len(SIGNATURE)] != SIGNATURE[:len(data)]:
        return 0, None
    if len(data) < HEADER:
        return None
    version_command, family_transport, length = struct.unpack("!BBH", data[12:HEADER])
    version, command = version_command >> 4, version_command & 0x0F
    if version != 2 or command not in (LOCAL, PROXY):
        raise ProxyHeaderError(f"PROXY protocol version {version} command {command}: only version 2 LOCAL/PROXY")
    if length > MAX_BLOCK:
        raise ProxyHeaderError(f"PROXY protocol address block of {length} bytes (at most {MAX_BLOCK})")
    if len(data) < HEADER + length:
        return None
    consumed = HEADER + length
    family = ADDRESSES.get(family_transport >> 4)
    if command == LOCAL or family is None:
        return consumed, None
    af, size = family
    if length < 2 * size + 4:
        raise ProxyHeaderError(f"PROXY protocol address block of {length} bytes, too short for its family")
    block = data[HEADER:consumed]
    source = socket.inet_ntop(af, block[:size])
    (port,) = struct.unpack("!H", block[2 * size:2 * size + 2])
    return consumed, (source, port)


def trusted_networks(values) -> tuple:
    """TRUSTED_PROXIES: addresses or networks (`127.0.0.1`, `10.0.0.0/8`, `::1`); a bad one is refused at
    start, naming it."""
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value, strict=False))
        except ValueError:
            raise ValueError(f"TRUSTED_PROXIES: {value!r} is not an IP address or network") from None
    return tuple(networks)


def is_trusted(peer, networks) -> bool:
    """Whether the connection's peer (a peername tuple) is one of the trusted proxies."""
    if not networks or not peer or not isinstance(peer, tuple):
        return False
    try:
        ip = ipaddress.ip_address(peer[0].split("%", 1)[0])
    except ValueError:
        return False
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in network for network in networks)
