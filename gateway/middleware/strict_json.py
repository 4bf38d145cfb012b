"""Request bodies are strict JSON: Python's json module reads NaN, Infinity and -Infinity, which are not
JSON. Accepted into a payload they would be stored and make every later answer that includes them fail
to serialize (a 500), so they are refused while the body is parsed, as a 400 like any other invalid JSON.

Routers that take a JSON body use `route_class=StrictJSONRoute`."""
from __future__ import annotations

import json
from typing import Any, Callable

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute

from gateway.telemetry import spans

CONSTANTS = ("NaN", "Infinity", "-Infinity")


def loads(body: bytes | str) -> Any:
    """Strict JSON through orjson: NaN, Infinity, numbers that overflow a double (json reads 1e400 as
    inf), lone surrogates and nesting deeper than 1024 are all refused as JSONDecodeError, which the
    routes answer with a 400 (json's RecursionError for deep nesting is no ValueError: it was a 500,
    seen on POST /v1/completions with 5,000 '['). orjson also parses ~3x faster than json."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        text = body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray, memoryview)) else body
        if "depth" in exc.msg:
            raise json.JSONDecodeError("nested too deeply", text, exc.pos) from None
        for at in (exc.pos - 1, exc.pos):  # orjson points at the "-" of -Infinity or after it
            constant = next((c for c in CONSTANTS if at >= 0 and text.startswith(c, at)), None)
            if constant:
                raise json.JSONDecodeError(f"{constant} is not a JSON number (NaN and Infinity are refused)",
                                           text, at) from None
        raise json.JSONDecodeError(exc.msg, text, exc.pos) from None


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads(await self.body())
            spans.note_model(self._json)  # a traced request's span names its model
        return self._json


class StrictJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler
