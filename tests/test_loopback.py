"""The one is_loopback that the gateway (open gateway, hub downloads) and the launcher (exposure) share."""
import pytest

from gateway.loopback import is_loopback


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LOCALHOST",
                                  " localhost ", " 127.0.0.1 ", "[::1] "])
def test_loopback_hosts(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["", "  ", "[]", "0.0.0.0", "::", "10.1.2.3", "192.168.0.1", "2001:db8::1",
                                  "example.com", "localhost.example.com", "not an ip"])
def test_other_hosts_are_not_loopback(host):
    # "" binds every address, so it must never count as loopback
    assert not is_loopback(host)
