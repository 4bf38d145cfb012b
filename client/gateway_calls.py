"""Calls to the gateway's JSON endpoints for the clients: an error answer, or no answer, becomes a
GatewayError naming the call, with the gateway's own message when it sent one."""
from __future__ import annotations


class GatewayError(Exception):
    pass


def call(http, method: str, path: str, body: dict | None = None) -> dict:
    """The JSON answer of `method path` on an httpx.Client; GatewayError for any status from 400 up."""
    import httpx

    try:
        response = http.request(method, path, json=body)
    except httpx.HTTPError as e:
        raise GatewayError(f"{method} {path}: {type(e).__name__}: {e}") from None
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:500]
        raise GatewayError(f"{method} {path}: HTTP {response.status_code}: {message}")
    return response.json()
