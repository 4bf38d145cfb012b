"""client/gateway_calls.py, the clients' one way to call the gateway: JSON back on success, a
GatewayError naming the call (with the gateway's own message when it sent one) on an error or no answer."""
from __future__ import annotations

import httpx
import pytest

from gateway_calls import GatewayError, call


def _client(handler) -> httpx.Client:
    return httpx.Client(base_url="http://gateway.test", transport=httpx.MockTransport(handler))


def test_a_success_returns_the_json_sent_with_the_body():
    seen = []

    def handler(request):
        seen.append((request.method, request.url.path, request.content))
        return httpx.Response(200, json={"count": 3})

    with _client(handler) as http:
        assert call(http, "PUT", "/collections/c", {"store": "faiss"}) == {"count": 3}
        assert call(http, "GET", "/collections/c") == {"count": 3}
    assert seen == [("PUT", "/collections/c", b'{"store":"faiss"}'), ("GET", "/collections/c", b"")]


def test_an_error_answer_names_the_call_and_carries_the_gateway_message():
    handler = lambda request: httpx.Response(401, json={"error": {"message": "missing API key"}})  # noqa: E731
    with _client(handler) as http, pytest.raises(GatewayError) as caught:
        call(http, "POST", "/v1/embeddings", {"input": "x"})
    assert str(caught.value) == "POST /v1/embeddings: HTTP 401: missing API key"


def test_an_error_answer_without_the_gateway_shape_carries_its_text_cut_short():
    handler = lambda request: httpx.Response(502, text="bad gateway " + "x" * 1000)  # noqa: E731
    with _client(handler) as http, pytest.raises(GatewayError) as caught:
        call(http, "GET", "/collections")
    message = str(caught.value)
    assert message.startswith("GET /collections: HTTP 502: bad gateway ") and len(message) < 560


def test_no_answer_is_a_gateway_error_too():
    def handler(request):
        raise httpx.ConnectError("connection refused", request=request)

    with _client(handler) as http, pytest.raises(GatewayError) as caught:
        call(http, "GET", "/collections")
    assert str(caught.value) == "GET /collections: ConnectError: connection refused"
