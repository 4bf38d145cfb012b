"""Encoded image bytes -> one RGB Pillow image: size checked from the header before any pixel is
decoded, first frame only, EXIF orientation applied, every mode converted to 8-bit RGB. A PNG's text and
ICC chunks are dropped before Pillow reads it (`without_inflated_chunks`)."""
from __future__ import annotations

import io
import struct
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from stage_common.errors import BadInput

_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N", "I")
_ALPHA = ("RGBA", "LA", "PA", "RGBa", "La")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# the ancillary chunks Pillow inflates (zTXt, iTXt, iCCP: up to PngImagePlugin.MAX_TEXT_CHUNK, 1 MiB, each,
# however many there are) or keeps as text (tEXt); none of them changes a pixel of what this stage returns
DROPPED_CHUNKS = frozenset((b"tEXt", b"zTXt", b"iTXt", b"iCCP"))


def without_inflated_chunks(data: bytes) -> bytes:
    """A PNG without its DROPPED_CHUNKS (the bytes as given when it has none, or is not a PNG): what the
    image costs to open does not depend on its text chunks. Only lengths are read; a chunk that runs past
    the end is kept as sent, for Pillow to refuse."""
    if not data.startswith(PNG_SIGNATURE):
        return data
    kept, start, at = [], 0, len(PNG_SIGNATURE)
    while at + 12 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, at)
        end = at + 12 + length
        if end > len(data) or kind == b"IEND":
            break
        if kind in DROPPED_CHUNKS:
            kept.append(data[start:at])
            start = end
        at = end
    if start == 0:
        return data
    kept.append(data[start:])
    return b"".join(kept)


def decode_image(data: bytes, max_pixels: int) -> Image.Image:
    if not data:
        raise BadInput("image is empty (zero bytes)")
    data = without_inflated_chunks(data)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))  # parses the header only
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise BadInput(f"image refused before decoding: {e}") from None
    except UnidentifiedImageError:
        raise BadInput(f"{len(data)} bytes that are not an image in any format Pillow reads "
                       "(JPEG, PNG, WebP, BMP, GIF, TIFF, ...)") from None
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - Pillow's plugins raise many types for garbage input
        raise BadInput(f"not a readable image ({len(data)} bytes): {e}") from None
    width, height = image.size
    if width * height > max_pixels:
        raise BadInput(f"image is {width}x{height} = {width * height / 1e6:.1f} megapixels, over the "
                       f"{max_pixels / 1e6:g} megapixel limit")
    try:
        image.load()  # the first frame of an animated image
        image = ImageOps.exif_transpose(image)
        return to_rgb(image)
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - truncated or corrupt pixel data
        raise BadInput(f"cannot decode {image.format or 'image'} {width}x{height}: {e}") from None


def to_rgb(image: Image.Image) -> Image.Image:
    """8-bit RGB; transparent areas over white; 16-bit samples keep their high byte."""
    if image.mode == "RGB":
        return image
    if image.mode in _SIXTEEN_BIT:
        high_byte = (np.clip(np.asarray(image, dtype=np.int64), 0, 65535) >> 8).astype(np.uint8)
        return Image.fromarray(high_byte, mode="L").convert("RGB")
    if image.mode == "F":
        return image.convert("L").convert("RGB")
    if image.mode in _ALPHA or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")
