"""schemathesis hooks for tools/fuzz_gateway.py, loaded inside .fuzz-venv (SCHEMATHESIS_HOOKS): how to make a
value of the gateway's own string format `image` (gateway/schemas/images.py), so that the schema-valid
requests schemathesis sends carry images the gateway reads: small PNGs of random pixels, as base64 or as
a data: URL. Runs in schemathesis' venv: the standard library, hypothesis and schemathesis only."""
from __future__ import annotations

import base64
import struct
import zlib

import schemathesis
from hypothesis import strategies as st

IMAGE_FORMAT = "image"  # gateway/schemas/images.py IMAGE_FORMAT (this venv cannot import the gateway)


def png(width: int, height: int, rgb: bytes) -> bytes:
    """An 8-bit RGB PNG of `rgb` (width * height * 3 bytes), written with zlib alone."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\0" + rgb[y * width * 3:(y + 1) * width * 3] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


@st.composite
def images(draw) -> str:
    width, height = draw(st.integers(1, 16)), draw(st.integers(1, 16))
    encoded = base64.b64encode(png(width, height, draw(st.binary(min_size=width * height * 3,
                                                                 max_size=width * height * 3)))).decode()
    return draw(st.sampled_from([encoded, f"data:image/png;base64,{encoded}"]))


schemathesis.openapi.format(IMAGE_FORMAT, images())
