"""Classify and caption food photos with the served food_captioning ensemble over gRPC.

    python client/caption.py photo.jpg [more.png ...] [--url localhost:8001]

Each image is its own request (all sent at once, so the server batches them): a file that is not a
usable image fails alone.
"""
from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from client.string_tensors import string_rows
from client.triton_urls import default_url


def caption(client: grpcclient.InferenceServerClient, data: bytes) -> tuple[str, float, str]:
    result = client.infer("food_captioning", [string_rows("image", [data])])
    return (result.as_numpy("label")[0, 0].decode(), float(result.as_numpy("score")[0, 0]),
            result.as_numpy("caption")[0, 0].decode())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="+", type=Path)
    parser.add_argument("--url", default=default_url("food_captioning"),
                        help="Triton gRPC address (default: GRPC_PORT, 8001; client/triton_urls.py)")
    args = parser.parse_args()
    client = grpcclient.InferenceServerClient(args.url)

    def run(path: Path):
        try:
            return caption(client, path.read_bytes())
        except (OSError, InferenceServerException) as e:
            return e

    with ThreadPoolExecutor(min(16, len(args.images))) as pool:
        results = list(pool.map(run, args.images))
    failed = 0
    for path, result in zip(args.images, results):
        if isinstance(result, Exception):
            failed += 1
            message = result.message() if isinstance(result, InferenceServerException) else str(result)
            print(f"{path}: error: {message}", file=sys.stderr)
        else:
            label, score, text = result
            print(f"{path}: {label} ({score:.3f}): {text}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
