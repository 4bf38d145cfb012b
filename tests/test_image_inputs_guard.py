"""Image inputs (issue 34, items 12, 14, 15): a URL fetch connects to the address it checked (no second
DNS answer can send it to loopback), refuses carrier-grade NAT space, and one deadline covers the whole
fetch; an image Pillow cannot read is a 400 whatever Pillow raises; the generated image stage takes its
size limits from the gateway's settings, so an image the gateway accepts is not refused by the stage."""
from __future__ import annotations

import asyncio
import http.server
import socket
import struct
import threading
import time

import numpy as np
import pytest

import fake_pb_utils as pb
from gateway.embedding import images
from gateway.errors import BadRequest
from gateway.modelgen import ExportOptions, ImageLimits, generate
from gateway.settings import Settings
from gateway_helpers import CLIP_DEMO, b64, png_bytes
from inprocess_gateway import inprocess_gateway
from model_configs import ROOT, load_generated

PUBLIC, INTERNAL = "127.0.0.2", "127.0.0.1"  # stand-ins: a public address the check passes, loopback


# ---- 12: the SSRF guard ---------------------------------------------------------------------------
@pytest.mark.parametrize("address, public", [
    ("100.64.0.1", False), ("100.127.255.254", False),  # carrier-grade NAT: not private, not global
    ("127.0.0.1", False), ("10.1.2.3", False), ("169.254.169.254", False), ("::1", False),
    ("::ffff:127.0.0.1", False), ("fd00::1", False), ("224.0.0.1", False), ("0.0.0.0", False),
    ("8.8.8.8", True), ("2001:4860:4860::8888", True)])
def test_only_global_unicast_addresses_are_public(address, public):
    assert images._public(address) is public


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


def serve(address: str, port: int, handler) -> _Server:
    server = _Server((address, port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def handler_for(body: bytes, drip_s: float | None = None):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                if drip_s is None:
                    self.wfile.write(body)
                    return
                for i in range(len(body)):  # a byte at a time: no phase ever times out
                    self.wfile.write(body[i:i + 1])
                    self.wfile.flush()
                    time.sleep(drip_s)
            except OSError:
                pass

        def log_message(self, *args):
            pass

    return Handler


def two_servers(public_body: bytes, internal_body: bytes):
    """The same port on PUBLIC and INTERNAL, each serving its own bytes."""
    for _ in range(20):
        with socket.socket() as probe:
            probe.bind((PUBLIC, 0))
            port = probe.getsockname()[1]
        try:
            public = serve(PUBLIC, port, handler_for(public_body))
        except OSError:
            continue
        try:
            return port, [public, serve(INTERNAL, port, handler_for(internal_body))]
        except OSError:
            public.shutdown()
    raise RuntimeError("no port free on both addresses")


def fake_dns(monkeypatch, answers: list[str]):
    """The event loop's resolver (which httpx's connection also uses) answers from `answers` in turn:
    a rebinding DNS server; and PUBLIC counts as public, loopback does not."""
    loop = asyncio.get_running_loop()
    calls = []

    async def getaddrinfo(host, port, *args, **kwargs):
        address = answers[min(len(calls), len(answers) - 1)]
        calls.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(images, "_public", lambda address: address == PUBLIC)
    return calls


def test_a_fetch_connects_to_the_address_it_checked(monkeypatch):
    public_image, internal_image = png_bytes(colour=(0, 0, 255)), png_bytes(colour=(255, 0, 0))
    port, servers = two_servers(public_image, internal_image)
    settings = Settings(image_url_allowlist=("rebind.example",), image_url_timeout_s=10.0)

    async def scenario():
        fake_dns(monkeypatch, [PUBLIC, INTERNAL])  # checked: public; asked again: loopback
        return await images.image_bytes(f"http://rebind.example:{port}/cat.png", settings)

    try:
        assert asyncio.run(scenario()) == public_image
    finally:
        for server in servers:
            server.shutdown()


def test_one_deadline_covers_the_whole_fetch(monkeypatch):
    body = png_bytes() + b"\0" * 1000
    with socket.socket() as probe:
        probe.bind((PUBLIC, 0))
        port = probe.getsockname()[1]
    server = serve(PUBLIC, port, handler_for(body, drip_s=0.05))  # ~50 s in all, a byte every 50 ms
    settings = Settings(image_url_allowlist=("slow.example",), image_url_timeout_s=1.0)

    async def scenario():
        fake_dns(monkeypatch, [PUBLIC])
        started = time.perf_counter()
        with pytest.raises(BadRequest, match="IMAGE_URL_TIMEOUT_S"):
            await asyncio.wait_for(images.image_bytes(f"http://slow.example:{port}/x.png", settings), 15)
        return time.perf_counter() - started

    try:
        assert asyncio.run(scenario()) < 5.0
    finally:
        server.shutdown()


# ---- 14: whatever Pillow raises, a bad image is a 400 ---------------------------------------------
def dds_with_unknown_pixel_format() -> bytes:
    """A DDS header Pillow's plugin refuses with NotImplementedError ("Unimplemented pixel format")."""
    header = struct.pack("<4sI", b"DDS ", 124) + struct.pack("<IIIIII", 0x1007, 4, 4, 0, 0, 0) + b"\0" * 44
    pixel_format = struct.pack("<II4sI4I", 32, 0x4, b"XXXX", 0, 0, 0, 0, 0)
    return header + pixel_format + struct.pack("<IIIII", 0x1000, 0, 0, 0, 0) + b"\0" * 64


def test_an_image_pillow_cannot_decode_is_a_400(tmp_path):
    async def scenario():
        async with inprocess_gateway(tmp_path) as (_app, client):
            response = await client.post("/infer", json={"model_name": "any",
                                                         "image": [b64(dds_with_unknown_pixel_format())]})
            assert response.status_code == 400, response.text
            assert "not an image in a format Pillow reads" in response.json()["error"]["message"]

    asyncio.run(scenario())


# ---- 15: one source for the image limits ----------------------------------------------------------
def test_the_generated_image_stage_takes_the_gateways_image_limits(tmp_path):
    settings = Settings()
    between = png_bytes() + b"\0" * (20_500_000 - len(png_bytes()))  # over 20,000,000, under 20 MiB
    assert 20_000_000 < len(between) <= settings.max_image_bytes
    images.check_image(between, settings)  # the gateway accepts it ...
    spec = generate(CLIP_DEMO, None, "clip", ROOT / CLIP_DEMO, tmp_path / "default",
                    export=ExportOptions(enabled=False), limits=ImageLimits.of(settings))
    stage = load_generated(tmp_path / "default", f"{spec.image_model.removesuffix('_image')}_image_preprocess")
    assert stage.max_image_bytes == settings.max_image_bytes
    (response,) = stage.execute([pb.InferenceRequest({"image": np.array([[between]], dtype=object)})])
    assert not response.has_error(), response.error().message()  # ... and so does the stage
    assert response.output("pixel_values").shape[0] == 1
    # an operator's MAX_IMAGE_BYTES / MAX_IMAGE_MEGAPIXELS reach the stage too
    custom = Settings.from_env({"MAX_IMAGE_BYTES": "1000", "MAX_IMAGE_MEGAPIXELS": "2.5"})
    spec = generate(CLIP_DEMO, None, "clip", ROOT / CLIP_DEMO, tmp_path / "custom",
                    export=ExportOptions(enabled=False), limits=ImageLimits.of(custom))
    config = (tmp_path / "custom" / f"{spec.image_model.removesuffix('_image')}_image_preprocess"
              / "config.pbtxt").read_text()
    assert 'key: "max_image_bytes" value: { string_value: "1000" }' in config
    assert 'key: "max_megapixels" value: { string_value: "2.5" }' in config
