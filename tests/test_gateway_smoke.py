"""The gateway starts beside Triton, answers errors in its JSON shape, and exposes docs and metrics."""
import pytest
pytestmark = pytest.mark.integration
def test_gateway_up(gateway):
    r = gateway.http.get("/health"); assert r.status_code == 200, r.text
    r = gateway.http.get("/nope"); assert r.status_code == 404 and r.json()["error"]["type"]
    r = gateway.http.get("/metrics/prometheus"); assert "gateway_requests_total" in r.text, r.text
    r = gateway.http.get("/docs"); assert r.status_code == 200
