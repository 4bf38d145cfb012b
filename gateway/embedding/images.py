"""Image inputs: base64 strings, `data:` URLs, or http(s) URLs from an allowlist of hosts (empty by
default), fetched with a size cap and one deadline, only from globally routable addresses (the connection
goes to the address that was checked).
Every image is checked from its header (a real image, at most MAX_IMAGE_MEGAPIXELS) before Triton sees it;
a PNG from its IHDR chunk alone (Pillow would inflate every text chunk before it: issue 43 item 4)."""
from __future__ import annotations

import asyncio
import base64
import binascii
import io
import ipaddress
import socket
import struct
import warnings
import zlib
from urllib.parse import urlsplit, urlunsplit

import httpx
from PIL import Image

from gateway.embedding import offload
from gateway.errors import BadRequest, PayloadTooLarge
from gateway.settings import Settings


# base64 characters decoded per call: binascii (and the validation) hold the GIL for a whole call, ~0.2 s
# for a 20 MB image here, during which the event loop's thread cannot run even though the decode is in a
# worker thread; between calls of ~3 ms (256 KiB) the GIL changes hands
B64_CHUNK = 1 << 18


def _decode_base64(text: str, what: str) -> bytes:
    text = text.strip()
    parts = []
    try:
        for start in range(0, len(text), B64_CHUNK):
            chunk = text[start:start + B64_CHUNK]
            if chunk.endswith("=") and start + B64_CHUNK < len(text):  # padding only at the very end
                raise ValueError("padding inside the data")
            parts.append(base64.b64decode(chunk, validate=True))
        return b"".join(parts)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{what} is neither valid base64 nor a data: or http(s) URL", param="image") from None


def _max_b64_chars(settings: Settings) -> int:
    return settings.max_image_bytes * 4 // 3 + 8


async def image_bytes(value: str, settings: Settings, what: str = "image") -> bytes:
    """The encoded image a request names, checked (`check_image`) before it is returned. Decoding and the
    header check run in the CPU pool (offload.py): ~0.2 s per 20 MB image here."""
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{what} is empty", param="image")
    if value[:8].lower().startswith(("http://", "https://")):
        data = await fetch_url(value, settings, what)
        await offload.run(check_image, data, settings, what)
        return data
    return await offload.run(inline_image, value, settings, what)


def inline_image(value: str, settings: Settings, what: str = "image") -> bytes:
    """A base64 string or `data:` URL, decoded and checked (blocking: call it through offload.run)."""
    payload = value
    if value[:5].lower() == "data:":
        header, sep, payload = value.partition(",")
        if not sep or ";base64" not in header.lower():
            raise BadRequest(f"{what}: a data: URL must be base64 (data:image/png;base64,...)", param="image")
    if len(payload) > _max_b64_chars(settings):
        raise PayloadTooLarge(f"{what} is over {settings.max_image_bytes} bytes (MAX_IMAGE_BYTES)", param="image")
    data = _decode_base64(payload, what)
    check_image(data, settings, what)
    return data


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# the PNG specification's colour types and the bit depths each allows
PNG_BIT_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}


def png_size(data: bytes) -> tuple[int, int] | None:
    """Width and height from a PNG's first chunk, which must be a well-formed IHDR; None if it is not.
    Pillow's own open reads every chunk up to the first IDAT and inflates each zTXt, iTXt and iCCP chunk
    (up to 1 MiB each, any number of them): 64 of them in a 67 KB image cost ~350 ms."""
    if len(data) < 33 or data[12:16] != b"IHDR" or data[8:12] != b"\0\0\0\r":
        return None
    width, height, depth, colour = struct.unpack_from(">IIBB", data, 16)
    if (zlib.crc32(data[12:29]) != struct.unpack_from(">I", data, 29)[0] or not 0 < width < 2 ** 31
            or not 0 < height < 2 ** 31 or depth not in PNG_BIT_DEPTHS.get(colour, ())):
        return None
    return width, height


def _pillow_size(data: bytes) -> tuple[int, int] | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data)).size  # the header only
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        return 10 ** 6, 10 ** 6
    except Exception:  # noqa: BLE001 - Pillow's plugins raise what they like (a DDS: NotImplementedError)
        return None


def check_image(data: bytes, settings: Settings, what: str = "image") -> None:
    if len(data) > settings.max_image_bytes:
        raise PayloadTooLarge(f"{what} is {len(data)} bytes, over {settings.max_image_bytes} (MAX_IMAGE_BYTES)",
                              param="image")
    size = png_size(data) if data.startswith(PNG_SIGNATURE) else _pillow_size(data)
    if size is None:
        raise BadRequest(f"{what} ({len(data)} bytes) is not an image in a format Pillow reads "
                         "(JPEG, PNG, WebP, BMP, GIF, TIFF, ...)", param="image")
    width, height = size
    if width * height > settings.max_image_megapixels * 1e6:
        raise PayloadTooLarge(f"{what} is {width}x{height} = {width * height / 1e6:.1f} megapixels, over "
                              f"{settings.max_image_megapixels:g} (MAX_IMAGE_MEGAPIXELS)", param="image")


def _public(address: str) -> bool:
    """Globally routable unicast only: `is_global` also refuses what `is_private` lets through, such as
    100.64.0.0/10 (carrier-grade NAT); an IPv4-mapped IPv6 address is judged as its IPv4 address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


async def _resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


def _pinned_url(parts, address: str, port: int) -> str:
    """The URL with its host replaced by the checked address: httpx must not resolve the name again (a
    second answer could be a loopback address: DNS rebinding)."""
    netloc = f"[{address}]" if ":" in address else address
    return urlunsplit((parts.scheme, f"{netloc}:{port}", parts.path or "/", parts.query, ""))


async def fetch_url(url: str, settings: Settings, what: str = "image") -> bytes:
    """GET an allowlisted image URL: the host's addresses are checked, the connection goes to the checked
    address (Host header and TLS server name stay the URL's host), no redirects, no proxies, and
    IMAGE_URL_TIMEOUT_S bounds the whole fetch (a server sending a byte at a time is cut off too)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not settings.image_url_allowlist:
        raise BadRequest(f"{what}: image URLs are disabled; send base64 or a data: URL, or list the host in "
                         "IMAGE_URL_ALLOWLIST", param="image")
    if host not in settings.image_url_allowlist:
        raise BadRequest(f"{what}: host {host!r} is not in IMAGE_URL_ALLOWLIST", param="image")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    timeout = settings.image_url_timeout_s
    try:
        async with asyncio.timeout(timeout):
            try:
                addresses = await _resolve(host, port)
            except OSError:
                raise BadRequest(f"{what}: cannot resolve host {host!r}", param="image") from None
            if not addresses or not all(_public(a) for a in addresses):
                raise BadRequest(f"{what}: host {host!r} resolves to a loopback, private or reserved address",
                                 param="image")
            headers = {"Host": parts.netloc.rpartition("@")[2]}
            # no redirects: a redirect could lead to a host or address the checks above refuse; no proxy
            # from the environment: the connection must reach the checked address itself
            async with httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False) as client:
                async with client.stream("GET", _pinned_url(parts, addresses[0], port), headers=headers,
                                         extensions={"sni_hostname": host}) as response:
                    if response.status_code != 200:
                        raise BadRequest(f"{what}: {url} answered HTTP {response.status_code}", param="image")
                    chunks, size = [], 0
                    async for chunk in response.aiter_bytes():
                        size += len(chunk)
                        if size > settings.max_image_bytes:
                            raise PayloadTooLarge(f"{what}: {url} is over {settings.max_image_bytes} bytes "
                                                  "(MAX_IMAGE_BYTES)", param="image")
                        chunks.append(chunk)
    except TimeoutError:
        raise BadRequest(f"{what}: fetching {url} took over {timeout:g}s (IMAGE_URL_TIMEOUT_S)",
                         param="image") from None
    except httpx.HTTPError as exc:
        raise BadRequest(f"{what}: fetching {url} failed ({type(exc).__name__})", param="image") from None
    return b"".join(chunks)
