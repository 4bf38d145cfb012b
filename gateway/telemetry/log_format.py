"""The gateway's log lines: `LOG_FORMAT=text` (the default, as before) or `LOG_FORMAT=json`, one JSON
object per line (time, level, logger, message; request_id and trace_id while a request is served; the
fields a line adds with `extra={"fields": {...}}`, as the access log does). uvicorn's own lines follow the
same format."""
from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

from gateway.telemetry.config import TelemetryOptions
from gateway.telemetry.context import REQUEST_ID
from gateway.telemetry.spans import current_trace_id

TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {"time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
                "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        trace_id = getattr(record, "trace_id", None) or current_trace_id()
        if request_id:
            line["request_id"] = request_id
        if trace_id:
            line["trace_id"] = trace_id
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, separators=(",", ":"), default=str)


def configure_logging(options: TelemetryOptions | None = None) -> None:
    """The root logger's format (INFO and up); in JSON mode uvicorn's lines too (its dictConfig is
    applied later, by uvicorn.Config: its formatters are pointed at ours before that)."""
    options = options or TelemetryOptions.from_env()
    if not options.json_logs:
        logging.basicConfig(level=logging.INFO, format=TEXT)
        return
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    from uvicorn.config import LOGGING_CONFIG

    for name in ("default", "access"):
        LOGGING_CONFIG["formatters"][name] = {"()": f"{__name__}.JsonFormatter"}
