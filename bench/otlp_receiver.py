"""A minimal OTLP/HTTP trace receiver on 127.0.0.1: what the tracing test (tests/test_tracing_server.py)
and the tracing bench collect spans with, in place of an OpenTelemetry Collector (none installs here).
It decodes each POST /v1/traces as opentelemetry-proto's ExportTraceServiceRequest (protobuf, or JSON
with Content-Type application/json; gzip when sent so) and keeps every span with its resource's
service.name. Run alone (`python -m bench.otlp_receiver --port N`) it only counts, so that a bench's
exports cost the load generator nothing."""
from __future__ import annotations

import argparse
import base64
import gzip
import json
import http.server
import threading
from dataclasses import dataclass

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)


@dataclass
class ReceivedSpan:
    service: str
    span: object  # opentelemetry.proto.trace.v1.Span

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_id(self) -> str:
        return self.span.parent_span_id.hex()

    @property
    def name(self) -> str:
        return self.span.name

    def attributes(self) -> dict:
        """Plain values: str, int, float, bool (arrays and maps as their JSON form)."""
        out = {}
        for attribute in self.span.attributes:
            kind = attribute.value.WhichOneof("value")
            value = getattr(attribute.value, kind) if kind else None
            out[attribute.key] = value if kind in ("string_value", "int_value", "double_value", "bool_value") \
                else json_format.MessageToDict(attribute.value)
        return out


_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _ids_to_base64(node):
    """OTLP/JSON writes trace and span ids in hex where protobuf's JSON mapping reads bytes as base64
    (Triton's exporter sends JSON): each id is re-encoded before parsing."""
    if isinstance(node, dict):
        return {k: base64.b64encode(bytes.fromhex(v)).decode() if k in _ID_FIELDS and isinstance(v, str)
                else _ids_to_base64(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_ids_to_base64(v) for v in node]
    return node


def decode(body: bytes, content_type: str, encoding: str) -> ExportTraceServiceRequest:
    if encoding == "gzip":
        body = gzip.decompress(body)
    request = ExportTraceServiceRequest()
    if content_type.startswith("application/json"):
        return json_format.ParseDict(_ids_to_base64(json.loads(body)), request, ignore_unknown_fields=True)
    request.ParseFromString(body)
    return request


class OtlpReceiver:
    """`with OtlpReceiver() as receiver:` ... `receiver.url`, `receiver.spans()`."""

    def __init__(self, keep: bool = True):
        self.keep, self._spans, self.count, self.posts = keep, [], 0, 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path.rstrip("/") != "/v1/traces":
                    self.send_error(404)
                    return
                message = decode(body, self.headers.get("Content-Type", ""), self.headers.get("Content-Encoding", ""))
                receiver.add(message)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *_args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def add(self, message: ExportTraceServiceRequest) -> None:
        with self._lock:
            self.posts += 1
            for resource_spans in message.resource_spans:
                service = next((a.value.string_value for a in resource_spans.resource.attributes
                                if a.key == "service.name"), "")
                for scope_spans in resource_spans.scope_spans:
                    self.count += len(scope_spans.spans)
                    if self.keep:
                        self._spans += [ReceivedSpan(service, span) for span in scope_spans.spans]

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def __enter__(self) -> "OtlpReceiver":
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port-file", required=True, help="where the receiver writes its URL once listening")
    args = parser.parse_args()
    with OtlpReceiver(keep=False) as receiver:
        with open(args.port_file, "w") as out:
            out.write(receiver.url)
        threading.Event().wait()


if __name__ == "__main__":
    main()
