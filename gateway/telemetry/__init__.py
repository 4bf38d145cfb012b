"""Traces and logs that let one request be followed: OpenTelemetry spans (off unless an OTLP endpoint is
set: `config.py`), the per-request span helpers the hot path calls (`spans.py`, a no-op when off), the
SDK set-up (`setup.py`, imported only when on) and the log lines' format (`log_format.py`, LOG_FORMAT=json).
The ASGI middleware that opens each request's span is gateway/middleware/tracing.py; docs/observability.md."""
