"""Stands in for `python -m launcher` in tests/test_cluster_unit.py: serves GATEWAY_PORT's /health with
200 and `x-replica-id: $REPLICA_ID` (after the PROXY header HAProxy sends), and starts a child in a session
of its own (as the launcher starts tritonserver and the gateway), which a SIGKILL of this process leaves
running. SIGTERM: the child is stopped and the process exits 0, as the real launcher does."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# the PROXY protocol v2 header's start (gateway/server/proxy_protocol.py; this script runs without the repo
# on its path): the signature, then version/command, family and the 2-byte length of what follows
SIGNATURE, HEADER = b"\r\n\r\n\x00\r\nQUIT\n", 16


class Health(BaseHTTPRequestHandler):
    def handle(self):
        """HAProxy begins each connection with a PROXY protocol v2 header (TRUSTED_PROXIES): skipped."""
        start = self.rfile.peek(HEADER)[:HEADER]
        if start.startswith(SIGNATURE):
            self.rfile.read(HEADER + int.from_bytes(start[14:16], "big"))
        super().handle()

    def do_GET(self):
        body = b'{"status": "ok"}'
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("x-replica-id", os.environ["REPLICA_ID"])
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


child = subprocess.Popen(["sleep", "300"], start_new_session=True)
print(f"fake launcher: child {child.pid}", flush=True)
server = ThreadingHTTPServer(("127.0.0.1", int(os.environ["GATEWAY_PORT"])), Health)


def on_term(_signum, _frame):
    child.kill()
    child.wait()
    threading.Thread(target=server.shutdown).start()


signal.signal(signal.SIGTERM, on_term)
server.serve_forever()
sys.exit(0)
