"""Behind `make cluster`'s HAProxy every connection reaches a gateway from HAProxy's address: the gateways
learn the real client from the PROXY protocol v2 header HAProxy sends (`send-proxy-v2`), believed only
from TRUSTED_PROXIES (gateway/server/proxy_protocol.py), so the per-address caps of issue 43 items 1-2
(MAX_CONNECTIONS_PER_CLIENT, a client address's share of the body budget) count each client. A PROXY
header or X-Forwarded-For from anyone else is not believed. HAProxy itself caps one address's connections.

The parser on its own, then the real HAProxy (launcher/cluster/haproxy.py) in front of a real gateway
(`python -m gateway`, no keys) and bench/fake_triton.py; clients on other loopback addresses (Linux routes
all of 127.0.0.0/8 to lo)."""
from __future__ import annotations

import shutil
import socket
import struct
import time

import pytest

from gateway.server.proxy_protocol import SIGNATURE, ProxyHeaderError, is_trusted, parse, trusted_networks
from launcher.cluster.haproxy import HAProxy
from launcher.gateway_process import GatewayProcess
from launcher.processes import free_port
from security_helpers import fake_triton_server, status_of

A, B = "127.0.0.2", "127.0.0.3"  # two clients through HAProxy
SHARE = 1_000_000  # BODY_BUFFER_KEY_BYTES: one client address's share of the body budget
HELD = 300_000  # body bytes each of A's stalled requests has sent (over HAProxy's 64 KiB buffer: forwarded)
PER_CLIENT = 50  # the gateway's MAX_CONNECTIONS_PER_CLIENT
FRONT_CAP = 6  # HAProxy's connections per client address


def v2_header(source: tuple[str, int], destination: tuple[str, int], command: int = 0x1) -> bytes:
    """A PROXY protocol v2 header of TCP over IPv4 or IPv6, as HAProxy writes it."""
    family, af = (0x1, socket.AF_INET) if ":" not in source[0] else (0x2, socket.AF_INET6)
    block = (socket.inet_pton(af, source[0]) + socket.inet_pton(af, destination[0])
             + struct.pack("!HH", source[1], destination[1]))
    return SIGNATURE + struct.pack("!BBH", 0x20 | command, family << 4 | 0x1, len(block)) + block


# --- the header on its own ---

def test_the_header_names_the_client_and_what_follows_is_http():
    data = v2_header(("192.0.2.7", 40000), ("127.0.0.1", 8091)) + b"GET / HTTP/1.1\r\n"
    consumed, source = parse(data)
    assert source == ("192.0.2.7", 40000) and data[consumed:] == b"GET / HTTP/1.1\r\n"
    six = v2_header(("2001:db8::5", 1234), ("::1", 8091))
    assert parse(six) == (len(six), ("2001:db8::5", 1234))


def test_a_header_split_over_reads_waits_for_the_rest():
    data = v2_header(("192.0.2.7", 40000), ("127.0.0.1", 8091))
    for cut in (1, 5, 12, 15, 16, len(data) - 1):
        assert parse(data[:cut]) is None, cut


def test_local_health_checks_and_plain_http_name_no_client():
    local = SIGNATURE + bytes([0x20, 0x00, 0, 0])  # HAProxy's health checks: LOCAL, no address block
    assert parse(local + b"GET /health") == (16, None)
    assert parse(b"GET /health HTTP/1.0\r\n") == (0, None)
    assert parse(b"\r\nGET / HTTP/1.1") == (0, None)  # a stray CRLF is not the signature


@pytest.mark.parametrize("bad, why", [
    (SIGNATURE + bytes([0x10, 0x11, 0, 12]), "version 1"),  # v1 is text: a v2 signature with version 1
    (SIGNATURE + bytes([0x22, 0x11, 0, 12]), "command 2"),
    (SIGNATURE + bytes([0x21, 0x11]) + struct.pack("!H", 4096), "4096 bytes"),
    (SIGNATURE + bytes([0x21, 0x11, 0, 4]) + b"\0" * 4, "too short"),
])
def test_a_malformed_header_is_refused(bad, why):
    with pytest.raises(ProxyHeaderError, match=why):
        parse(bad)


def test_only_the_configured_proxies_are_trusted():
    networks = trusted_networks(["127.0.0.1", "10.0.0.0/8", "::1"])
    assert is_trusted(("127.0.0.1", 5), networks) and is_trusted(("10.2.3.4", 5), networks)
    assert is_trusted(("::ffff:127.0.0.1", 5, 0, 0), networks) and is_trusted(("::1", 5, 0, 0), networks)
    assert not is_trusted(("127.0.0.2", 5), networks) and not is_trusted(("11.0.0.1", 5), networks)
    assert not is_trusted(("127.0.0.1", 5), ()) and not is_trusted(None, networks)
    with pytest.raises(ValueError, match="TRUSTED_PROXIES: 'proxy.example'"):
        trusted_networks(["proxy.example"])


# --- the real HAProxy in front of a gateway ---

@pytest.fixture(scope="module")
def stand(tmp_path_factory):
    if not shutil.which("haproxy") and not shutil.which("/usr/sbin/haproxy"):
        pytest.fail("haproxy is not installed (deploy/install_tools.sh installs it)")
    tmp = tmp_path_factory.mktemp("client_address")
    with fake_triton_server(tmp) as triton:
        gateway = GatewayProcess(triton.grpc_url, port=free_port(), data_dir=tmp / "data", log_file=tmp / "gateway.log",
                                 env={"TRUSTED_PROXIES": "127.0.0.1", "MAX_CONNECTIONS_PER_CLIENT": str(PER_CLIENT),
                                      "BODY_BUFFER_KEY_BYTES": str(SHARE), "PRELOAD_MODELS": "",
                                      "HF_ENDPOINT": "http://127.0.0.1:9"}).start(timeout=180)
        balancer = HAProxy("127.0.0.1", free_port(), [("replica-0", "127.0.0.1", gateway.port)], tmp,
                           source="127.0.0.1", client_connections=FRONT_CAP)
        try:
            balancer.start()
            balancer.admin.wait("replica-0", lambda row: row.get("status") == "UP", 30, "not UP in haproxy")
            yield gateway, balancer
        finally:
            balancer.stop()
            gateway.stop()


def connect(port: int, source: str) -> socket.socket:
    sock = socket.socket()
    sock.settimeout(30)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def answer(sock: socket.socket) -> tuple[int, bytes]:
    """(status, the whole answer) of a request sent with `Connection: close`; (0, b"") when the connection
    ended without one: a gateway that refuses a body closes with some of it unread, and the reset that
    this sends may reach HAProxy before the 503 does."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return (int(data.split()[1]), data) if data else (0, b"")


def post(port: int, source: str, size: int, extra: str = "") -> tuple[int, bytes]:
    """A whole POST /v1/embeddings of `size` bytes (not valid JSON: what matters is whether it is admitted)."""
    with connect(port, source) as sock:
        try:
            sock.sendall(f"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {size}\r\nConnection: close\r\n{extra}\r\n".encode() + b"x" * size)
        except ConnectionError:
            pass  # answered and closed before the whole body was sent: the answer may still be there
        return answer(sock)


def get_health(port: int, source: str, prefix: bytes = b"") -> tuple[int, bytes]:
    with connect(port, source) as sock:
        sock.sendall(prefix + b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        return answer(sock)


def hold_body(port: int, source: str, sent: int) -> socket.socket:
    """A POST whose body stops 1,000 bytes short: the gateway holds its bytes and its connection
    (BODY_TIMEOUT_S). Declared barely over what is sent, so that what it declares fits A's share."""
    sock = connect(port, source)
    sock.sendall(f"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {sent + 1000}\r\n\r\n".encode() + b"x" * sent)
    return sock


def probe(port: int, source: str) -> tuple[int, bytes]:
    """Declares 150,000 bytes and sends 70,000 (over HAProxy's 64 KiB buffer, so it is passed on): refused
    at once where the declared size is over what the client address has left of its share; else it
    waits for the rest, given up after 2 s, holding at most what it sent (so that it never takes bytes
    that A's held bodies, still arriving, need)."""
    with connect(port, source) as sock:
        sock.settimeout(2)
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 150000\r\n\r\n" + b"x" * 70_000)
        return answer(sock)


def full_share(status_body: tuple[int, bytes]) -> bool:
    return status_body[0] == 503 and b'"code":"body_buffer_full"' in status_body[1]


@pytest.mark.integration
def test_the_body_share_counts_each_client_behind_haproxy_not_haproxy(stand):
    _, balancer = stand
    held = [hold_body(balancer.port, A, HELD) for _ in range(3)]  # 900,000 of A's 1,000,000
    try:
        # A's next 150,000-byte body is over A's share once the gateway holds those bytes ...
        deadline = time.monotonic() + 60
        while not full_share(refused := probe(balancer.port, A)):
            assert time.monotonic() < deadline, f"A's held bodies never filled its share: {refused[1][-300:]!r}"
        assert b"client address" in refused[1]
        # ... while B's is within B's own share (read whole: 400, not JSON); before, both were HAProxy's
        # address and B got that 503
        assert (b_post := post(balancer.port, B, 150_000))[0] == 400, b_post[1][-300:]
        # an X-Forwarded-For passed on by HAProxy is not believed, even from HAProxy's own address
        forwarded = post(balancer.port, "127.0.0.1", 150_000, f"X-Forwarded-For: {A}\r\n")
        assert forwarded[0] == 400, forwarded[1][-300:]
    finally:
        for sock in held:
            sock.close()


@pytest.mark.integration
def test_the_connection_cap_counts_the_client_a_trusted_proxy_names(stand):
    """What HAProxy sends, from its address: PER_CLIENT connections of one named client fill that client's
    cap and no one else's."""
    gateway, _ = stand
    named = {client: v2_header((client, 1000), ("127.0.0.1", gateway.port)) for client in ("127.0.0.4", "127.0.0.5")}
    held = []
    try:
        for _ in range(PER_CLIENT):
            held.append(connect(gateway.port, "127.0.0.1"))
            held[-1].sendall(named["127.0.0.4"])  # and no request yet (HEADER_TIMEOUT_S is 10 s)
        deadline = time.monotonic() + 30
        while (refused := get_health(gateway.port, "127.0.0.1", named["127.0.0.4"]))[0] != 503:
            assert time.monotonic() < deadline, f"127.0.0.4 was never refused: {refused[1][-300:]!r}"
            time.sleep(0.5)
        assert b'"code":"too_many_connections"' in refused[1]
        assert get_health(gateway.port, "127.0.0.1", named["127.0.0.5"])[0] == 200
        assert get_health(gateway.port, "127.0.0.1")[0] == 200  # the proxy's own address: a health check
    finally:
        for sock in held:
            sock.close()


@pytest.mark.integration
def test_a_proxy_header_from_any_other_peer_is_not_believed(stand):
    gateway, _ = stand
    claim = v2_header(("127.0.0.9", 1000), ("127.0.0.1", gateway.port))
    status, _ = get_health(gateway.port, B, claim)  # B is not a trusted proxy: its header is not HTTP
    assert status == 400
    assert get_health(gateway.port, B)[0] == 200
    # from the trusted address the same header is read (what HAProxy sends)
    assert get_health(gateway.port, "127.0.0.1", claim)[0] == 200


@pytest.mark.integration
def test_haproxy_caps_one_address_connections(stand):
    _, balancer = stand
    client = "127.0.0.6"  # an address no other test used: HAProxy counts its connections alone
    half_open = []
    try:
        for _ in range(FRONT_CAP):  # headers never finished: HAProxy holds them, no gateway sees them
            half_open.append(connect(balancer.port, client))
            half_open[-1].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.3)
        with pytest.raises(ConnectionError):  # reset as it opens, or closed without an answer
            with connect(balancer.port, client) as over:
                over.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                status_of(over)
        assert get_health(balancer.port, B)[0] == 200
    finally:
        for sock in half_open:
            sock.close()
