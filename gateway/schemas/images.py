"""An image field of a request body: base64 (or a `data:` URL) of an image Pillow reads, or an http(s) URL
of a host in IMAGE_URL_ALLOWLIST (gateway/embedding/images.py checks it). No JSON-schema keyword can say
"an image", so the document names the gateway's own string format, `image`; a client (or a fuzzer:
tools/fuzz_hooks.py) that knows the format can make valid values. Anything else ("" too) is a 400."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

IMAGE_FORMAT = "image"
Image = Annotated[str, Field(json_schema_extra={"format": IMAGE_FORMAT},
                             description="an image: base64 or a data: URL (data:image/png;base64,...) of a JPEG, "
                                         "PNG, WebP, BMP, GIF, TIFF, ... (what Pillow reads), or an http(s) URL of a "
                                         "host in IMAGE_URL_ALLOWLIST")]
