"""What the telemetry of one gateway is, from the environment: OpenTelemetry's standard variables
(the SDK reads most of them itself: OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER/_ARG, OTEL_BSP_*,
OTEL_EXPORTER_OTLP_HEADERS...; this decides only on or off and the traces URL, which the launcher also
gives Triton), ACCESS_LOG and LOG_FORMAT. Plain code, no OpenTelemetry import."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"  # the whole URL, used as it is
ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"  # a base URL: /v1/traces is added (the specification's rule)
DEFAULT_SERVICE = "triton-gateway"  # the gateway's service.name when OTEL_SERVICE_NAME is unset
TRITON_SERVICE = "triton-inference-server"  # Triton's own default service.name, kept explicit
_ON = {"1", "true", "yes", "on"}
_OFF = {"", "0", "false", "no", "off"}


def traces_url(env: Mapping[str, str] | None = None) -> str | None:
    """The OTLP/HTTP traces URL, or None when tracing is off: no endpoint set, OTEL_SDK_DISABLED=true or
    OTEL_TRACES_EXPORTER=none. Triton exports OTLP over HTTP only, so a gRPC protocol is refused here
    rather than left to fail every export in silence."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return None
    url = env.get(TRACES_ENDPOINT, "").strip()
    base = env.get(ENDPOINT, "").strip()
    if not url and not base:
        return None
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = env.get(name, "").strip().lower()
        if protocol and protocol != "http/protobuf":
            raise ValueError(f"{name}={protocol!r}: the gateway and Triton export traces over OTLP/HTTP only "
                             "(http/protobuf, port 4318 by convention)")
    return url or f"{base.rstrip('/')}/v1/traces"


def _switch(env: Mapping[str, str], name: str) -> bool:
    value = env.get(name, "").strip().lower()
    if value in _ON or value in _OFF:
        return value in _ON
    raise ValueError(f"{name} must be 1/true/yes/on or 0/false/no/off, not {value!r}")


@dataclass(frozen=True)
class TelemetryOptions:
    traces_url: str | None = None  # None: no tracer, no exporter, no span anywhere
    access_log: bool = False  # one line per request (ACCESS_LOG=1): off by default, as before
    json_logs: bool = False  # LOG_FORMAT=json: every log line one JSON object

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "TelemetryOptions":
        env = os.environ if env is None else env
        log_format = env.get("LOG_FORMAT", "text").strip().lower() or "text"
        if log_format not in ("text", "json"):
            raise ValueError(f"LOG_FORMAT must be text or json, not {log_format!r}")
        return cls(traces_url(env), _switch(env, "ACCESS_LOG"), log_format == "json")
