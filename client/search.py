"""Image search through the gateway (issue 11): index a folder of images into a collection, query it
with an image or a sentence, print a results table.

    python client/search.py index DIR --collection NAME [--model demo_models/clip-demo] [--store faiss|qdrant]
    python client/search.py query IMAGE --collection NAME [--limit 10] [--filter key=value ...]
    python client/search.py query --text "a red car" --collection NAME
    python client/search.py demo-images DIR [--count 200]   # generated test images (colours and patterns)

Options: --gateway http://localhost:8080. `index` loads the model (POST /load_clip_model), creates the
collection (PUT /collections/NAME) and sends the images in batches of --batch; the point id is the file
name without its extension (characters outside [A-Za-z0-9_-] become '_') and the payload holds the file name.
"""
from __future__ import annotations

import argparse
import base64
import colorsys
import io
import re
import sys
from pathlib import Path

import numpy as np

from client.gateway_calls import GatewayError, call
from client.gateway_key import add_api_key_argument, auth_headers

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp"}
PATTERNS = ("plain", "hstripes", "vstripes", "checker", "circle", "diagonal", "dots", "gradient")


def demo_image(i: int, size: tuple[int, int] = (96, 96)):
    """The i-th generated image: a distinct hue and lightness, with one of PATTERNS in a second colour
    at a period that varies with i (a PIL image)."""
    from PIL import Image

    w, h = size
    # pattern x 25 hues: 200 distinct images, then lightness and period change
    hue = ((i // len(PATTERNS)) % 25) / 25
    light = 0.5 + 0.15 * ((i // 200) % 3 - 1)
    fg = np.array(colorsys.hls_to_rgb(hue, light, 0.9)) * 255
    bg = np.array(colorsys.hls_to_rgb((hue + 0.5) % 1.0, 1 - light, 0.6)) * 255
    y, x = np.mgrid[0:h, 0:w]
    period = 6 + (i // 200 + i // len(PATTERNS)) % 4 * 4
    pattern = PATTERNS[i % len(PATTERNS)]
    mask = {"plain": np.zeros((h, w), bool),
            "hstripes": (y // period) % 2 == 0,
            "vstripes": (x // period) % 2 == 0,
            "checker": ((x // period) + (y // period)) % 2 == 0,
            "circle": (x - w / 2) ** 2 + (y - h / 2) ** 2 < (period * 3) ** 2,
            "diagonal": ((x + y) // period) % 2 == 0,
            "dots": ((x % period) - period / 2) ** 2 + ((y % period) - period / 2) ** 2 < (period / 3) ** 2,
            "gradient": x / w > 0.5}[pattern]
    pixels = np.where(mask[..., None], bg, fg)
    if pattern == "gradient":
        pixels = pixels * (0.5 + 0.5 * (y / h))[..., None]
    return Image.fromarray(pixels.clip(0, 255).astype(np.uint8), "RGB")


def encode(image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def point_id(path: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", path.stem)[:128] or "image"


def print_results(results: list[dict]) -> None:
    print(f"{'rank':>4}  {'score':>8}  {'id':<40} payload")
    for rank, r in enumerate(results, 1):
        print(f"{rank:>4}  {r['score']:8.4f}  {r['id']:<40} {r['payload']}")


def cmd_index(http, args) -> None:
    files = sorted(p for p in Path(args.dir).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise GatewayError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in {args.dir}")
    call(http, "POST", "/load_clip_model", {"model_name": args.model})
    call(http, "PUT", f"/collections/{args.collection}", {"model": args.model, "store": args.store})
    for start in range(0, len(files), args.batch):
        batch = files[start:start + args.batch]
        points = [{"id": point_id(p), "image": b64(p.read_bytes()), "payload": {"file": p.name}} for p in batch]
        done = call(http, "POST", f"/collections/{args.collection}/points", {"points": points})
        print(f"indexed {start + len(batch)}/{len(files)} (collection count {done['count']})", flush=True)
    info = call(http, "GET", f"/collections/{args.collection}")
    print(f"{'collection':<20} {'model':<30} {'store':<7} {'dim':>5} {'count':>7}")
    print(f"{info['name']:<20} {info['model']:<30} {info['store']:<7} {info['dimension']:>5} {info['count']:>7}")


def parse_filter(items: list[str]) -> dict | None:
    out = {}
    for item in items or []:
        key, _, value = item.partition("=")
        out[key] = int(value) if re.fullmatch(r"-?\d+", value) else {"true": True, "false": False}.get(value, value)
    return out or None


def cmd_query(http, args) -> None:
    if (args.image is None) == (args.text is None):
        raise GatewayError("give an IMAGE or --text, not both")
    body = {"limit": args.limit, "filter": parse_filter(args.filter)}
    body.update({"image": b64(Path(args.image).read_bytes())} if args.image else {"text": args.text})
    answer = call(http, "POST", f"/collections/{args.collection}/search", body)
    print_results(answer["results"])
    print(f"({answer['processingTimeMs']:.1f} ms in the gateway)")


def cmd_demo(args) -> None:
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(args.count):
        demo_image(i).save(folder / f"demo_{i:05d}.png")
    print(f"wrote {args.count} images to {folder}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gateway", default="http://localhost:8080")
    add_api_key_argument(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    index = sub.add_parser("index", help="index a folder of images")
    index.add_argument("dir")
    index.add_argument("--collection", required=True)
    index.add_argument("--model", default="demo_models/clip-demo")
    index.add_argument("--store", choices=["faiss", "qdrant"], default="faiss")
    index.add_argument("--batch", type=int, default=32)
    query = sub.add_parser("query", help="search a collection with an image or a sentence")
    query.add_argument("image", nargs="?")
    query.add_argument("--text")
    query.add_argument("--collection", required=True)
    query.add_argument("--limit", type=int, default=10)
    query.add_argument("--filter", nargs="*", metavar="KEY=VALUE")
    demo = sub.add_parser("demo-images", help="write generated test images to a folder")
    demo.add_argument("dir")
    demo.add_argument("--count", type=int, default=200)
    args = parser.parse_args()
    if args.command == "demo-images":
        cmd_demo(args)
        return 0
    import httpx

    with httpx.Client(base_url=args.gateway, timeout=600, headers=auth_headers(args.api_key)) as http:
        try:
            (cmd_index if args.command == "index" else cmd_query)(http, args)
        except (GatewayError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
