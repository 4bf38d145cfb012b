"""Embed sentences with the served text_embedding ensemble over gRPC.

    python client/embed.py "first sentence" "second sentence" [--url localhost:8001]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from string_tensors import string_rows


def embed(url: str, texts: list[str]) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url)
    return client.infer("text_embedding", [string_rows("text", texts)]).as_numpy("embedding")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("texts", nargs="+")
    parser.add_argument("--url", default="localhost:8001", help="Triton gRPC address")
    args = parser.parse_args()
    try:
        vectors = embed(args.url, args.texts)
    except InferenceServerException as e:
        print(f"error: {e.message()}", file=sys.stderr)
        return 1
    for i, (text, v) in enumerate(zip(args.texts, vectors)):
        print(f"[{i}] dim={v.shape[0]} norm={np.linalg.norm(v):.6f}  {text[:60]!r}")
    if len(args.texts) > 1:
        print("cosine similarity:")
        sims = vectors @ vectors.T  # rows are L2-normalized
        for i in range(len(args.texts)):
            for j in range(i + 1, len(args.texts)):
                print(f"  [{i}] vs [{j}]: {sims[i, j]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
