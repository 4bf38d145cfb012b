"""bench/http_load.py against two tiny local HTTP servers: a closed loop sends each target its own headers,
and the interleaved load sends every target the same share of requests (what bench_security compares)."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.http_load import run_http_load, run_http_load_interleaved


class Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the gateway

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.seen.append(self.headers.get("Authorization"))
        self.send_response(self.server.status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture
def servers():
    started = []
    for status in (200, 200):
        server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
        server.seen, server.status = [], status
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
    yield started
    for server in started:
        server.shutdown()
        server.server_close()


def url(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/v1/embeddings"


def test_interleaved_load_sends_each_target_its_headers_and_an_equal_share(servers):
    a, b = servers
    results = run_http_load_interleaved({"open": (url(a), {}), "keyed": (url(b), {"Authorization": "Bearer k"})},
                                        lambda: {"input": "x"}, concurrency=4, window=0.6, warmup=0.1)
    assert set(results) == {"open", "keyed"}
    assert set(a.seen) == {None} and set(b.seen) == {"Bearer k"}
    counted = [len(r.latencies) for r in results.values()]
    assert min(counted) > 10 and abs(counted[0] - counted[1]) <= 4  # one each per client turn, 4 clients
    assert all(r.errors == 0 for r in results.values())


def test_a_single_target_counts_errors_with_the_first_one(servers):
    a, _ = servers
    a.status = 429
    result = run_http_load(url(a), lambda: {"input": "x"}, concurrency=2, window=0.4, warmup=0.1, api_key="k2")
    assert not result.latencies and result.errors > 0 and result.first_error.startswith("HTTP 429")
    assert set(a.seen) == {"Bearer k2"}
