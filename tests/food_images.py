"""Test images made with Pillow on the fly (no binary fixtures): every format and mode the
food_captioning preprocess stage must handle, plus broken and hostile inputs."""
from __future__ import annotations

import struct
import zlib

import numpy as np
from PIL import Image

from bench.images import encode, photo  # noqa: F401 - the photo-like images, shared with the benches' workload


def exif_rotated_jpeg(image: Image.Image, orientation: int = 6) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(image, "JPEG", quality=95, exif=exif.tobytes())


def animated_gif(width: int, height: int) -> bytes:
    first, second = Image.new("RGB", (width, height), (200, 30, 30)), Image.new("RGB", (width, height), (30, 30, 200))
    return encode(first, "GIF", save_all=True, append_images=[second], duration=100, loop=0)


def sixteen_bit_png(width: int, height: int) -> bytes:
    values = (np.arange(width * height, dtype=np.uint32).reshape(height, width) * 997 % 65536).astype(np.uint16)
    return encode(Image.fromarray(values), "PNG")  # uint16 -> mode I;16


def palette_png_with_transparency(width: int, height: int) -> bytes:
    image = photo(width, height, seed=5).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    image.info["transparency"] = 0
    return encode(image, "PNG", transparency=0)


def bomb_png(width: int = 30000, height: int = 30000) -> bytes:
    """A valid 1-bit PNG of width x height black pixels, ~100 KB compressed, built row by row."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" + b"\x00" * ((width + 7) // 8)
    compressor, parts = zlib.compressobj(9), []
    for _ in range(height):
        parts.append(compressor.compress(row))
    parts.append(compressor.flush())
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"".join(parts)) + chunk(b"IEND", b"")


def mixed_images() -> dict[str, bytes]:
    """Valid images of every kind, at varied sizes (16 of them)."""
    return {
        "rgb.jpg": encode(photo(640, 480, 1), "JPEG", quality=90),
        "portrait.png": encode(photo(300, 500, 2), "PNG"),
        "rgba.png": encode(photo(200, 150, 3).convert("RGBA"), "PNG"),
        "la.png": encode(photo(120, 90, 4).convert("LA"), "PNG"),
        "palette.png": palette_png_with_transparency(160, 100),
        "grey.jpg": encode(photo(256, 256, 6).convert("L"), "JPEG"),
        "cmyk.jpg": encode(photo(180, 240, 7).convert("CMYK"), "JPEG"),
        "16bit.png": sixteen_bit_png(64, 48),
        "exif6.jpg": exif_rotated_jpeg(photo(320, 200, 8)),
        "animated.gif": animated_gif(90, 60),
        "photo.webp": encode(photo(400, 300, 9), "WEBP", quality=80),
        "photo.bmp": encode(photo(50, 70, 10), "BMP"),
        "one_pixel.png": encode(Image.new("RGB", (1, 1), (10, 200, 30)), "PNG"),
        "wide.jpg": encode(photo(1000, 60, 11), "JPEG"),
        "mono.png": encode(photo(80, 80, 12).convert("1"), "PNG"),
        "tiny.gif": encode(photo(3, 5, 13).convert("P"), "GIF"),
    }


def truncated_jpeg() -> bytes:
    data = encode(photo(400, 300, 20), "JPEG", quality=90)
    return data[: len(data) // 2]
