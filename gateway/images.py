"""Image inputs: base64 strings, `data:` URLs, or http(s) URLs from an allowlist of hosts (empty by
default), fetched with a size cap and a timeout, never from loopback, private or link-local addresses.
Every image is checked from its header (a real image, at most MAX_IMAGE_MEGAPIXELS) before Triton sees it."""
from __future__ import annotations

import asyncio
import base64
import binascii
import io
import ipaddress
import socket
import warnings
from urllib.parse import urlsplit

import httpx
from PIL import Image, UnidentifiedImageError

from gateway.errors import BadRequest, PayloadTooLarge
from gateway.settings import Settings


def _decode_base64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{what} is neither valid base64 nor a data: or http(s) URL", param="image") from None


def _max_b64_chars(settings: Settings) -> int:
    return settings.max_image_bytes * 4 // 3 + 8


async def image_bytes(value: str, settings: Settings, what: str = "image") -> bytes:
    """The encoded image a request names, checked (`check_image`) before it is returned."""
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{what} is empty", param="image")
    scheme = value[:8].lower()
    if scheme.startswith(("http://", "https://")):
        data = await fetch_url(value, settings, what)
    else:
        payload = value
        if scheme.startswith("data:"):
            header, sep, payload = value.partition(",")
            if not sep or ";base64" not in header.lower():
                raise BadRequest(f"{what}: a data: URL must be base64 (data:image/png;base64,...)", param="image")
        if len(payload) > _max_b64_chars(settings):
            raise PayloadTooLarge(f"{what} is over {settings.max_image_bytes} bytes (MAX_IMAGE_BYTES)", param="image")
        data = _decode_base64(payload, what)
    check_image(data, settings, what)
    return data


def check_image(data: bytes, settings: Settings, what: str = "image") -> None:
    if len(data) > settings.max_image_bytes:
        raise PayloadTooLarge(f"{what} is {len(data)} bytes, over {settings.max_image_bytes} (MAX_IMAGE_BYTES)",
                              param="image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            width, height = Image.open(io.BytesIO(data)).size  # the header only
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        width = height = 10 ** 6
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise BadRequest(f"{what} ({len(data)} bytes) is not an image in a format Pillow reads "
                         "(JPEG, PNG, WebP, BMP, GIF, TIFF, ...)", param="image") from None
    if width * height > settings.max_image_megapixels * 1e6:
        raise PayloadTooLarge(f"{what} is {width}x{height} = {width * height / 1e6:.1f} megapixels, over "
                              f"{settings.max_image_megapixels:g} (MAX_IMAGE_MEGAPIXELS)", param="image")


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return not (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_reserved or ip.is_multicast
                or ip.is_unspecified)


async def fetch_url(url: str, settings: Settings, what: str = "image") -> bytes:
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not settings.image_url_allowlist:
        raise BadRequest(f"{what}: image URLs are disabled; send base64 or a data: URL, or list the host in "
                         "IMAGE_URL_ALLOWLIST", param="image")
    if host not in settings.image_url_allowlist:
        raise BadRequest(f"{what}: host {host!r} is not in IMAGE_URL_ALLOWLIST", param="image")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        raise BadRequest(f"{what}: cannot resolve host {host!r}", param="image") from None
    addresses = {info[4][0] for info in infos}
    if not addresses or not all(_public(a) for a in addresses):
        raise BadRequest(f"{what}: host {host!r} resolves to a loopback, private or reserved address", param="image")
    try:  # no redirects: a redirect could lead to a host or address the checks above refuse
        async with httpx.AsyncClient(timeout=settings.image_url_timeout_s, follow_redirects=False) as client:
            async with client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise BadRequest(f"{what}: {url} answered HTTP {response.status_code}", param="image")
                chunks, size = [], 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > settings.max_image_bytes:
                        raise PayloadTooLarge(f"{what}: {url} is over {settings.max_image_bytes} bytes (MAX_IMAGE_BYTES)",
                                              param="image")
                    chunks.append(chunk)
    except httpx.HTTPError as exc:
        raise BadRequest(f"{what}: fetching {url} failed ({type(exc).__name__})", param="image") from None
    return b"".join(chunks)
