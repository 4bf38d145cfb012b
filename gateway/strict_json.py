"""Request bodies are strict JSON: Python's json module reads NaN, Infinity and -Infinity, which are not
JSON. Accepted into a payload they would be stored and make every later answer that includes them fail
to serialize (a 500), so they are refused while the body is parsed, as a 400 like any other invalid JSON.

Routers that take a JSON body use `route_class=StrictJSONRoute`."""
from __future__ import annotations

import json
from typing import Any, Callable

from fastapi import Request, Response
from fastapi.routing import APIRoute


def _refuse(constant: str):
    raise ValueError(constant)


def loads(body: bytes | str) -> Any:
    """json.loads without NaN/Infinity: JSONDecodeError naming the constant and where it is. JSON nested
    deeper than Python's recursion limit is a JSONDecodeError too: json raises RecursionError for it, which
    is no ValueError, so callers that catch ValueError for bad JSON let it through as a 500 (seen: POST
    /v1/completions with 5,000 '[' and a tokens-per-minute quota)."""
    try:
        return json.loads(body, parse_constant=_refuse)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", "", 0) from None
    except ValueError as exc:
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        constant = str(exc)
        raise json.JSONDecodeError(f"{constant} is not a JSON number (NaN and Infinity are refused)", text,
                                   max(text.find(constant), 0)) from None


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler
