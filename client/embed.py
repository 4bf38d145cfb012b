"""Embed sentences (and, through the gateway, images) and print their norms and cosine similarities.

    python client/embed.py "first sentence" "second sentence" [--url localhost:8001]     # Triton gRPC
    python client/embed.py "a red square" --gateway http://localhost:8080 \\
        [--model demo_models/clip-demo] [--image photo.jpg ...] [--load]               # the HTTP gateway

With --gateway, texts go to POST /v1/embeddings (or /infer when images are given, which needs a CLIP
model); --load loads the model first (POST /load_clip_model when images are given, else
/load_sentence_transformer_model).
"""
from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path

import numpy as np

from client.gateway_calls import GatewayError, call
from client.gateway_key import add_api_key_argument, auth_headers
from client.triton_urls import default_url

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def embed(url: str, texts: list[str]) -> np.ndarray:
    import tritonclient.grpc as grpcclient

    from string_tensors import string_rows

    client = grpcclient.InferenceServerClient(url)
    return client.infer("text_embedding", [string_rows("text", texts)]).as_numpy("embedding")


def embed_gateway(url: str, model: str, texts: list[str], images: list[Path], load: bool = False,
                  api_key: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(text vectors, image vectors), L2-normalized, from the gateway at `url`."""
    import httpx

    with httpx.Client(base_url=url.rstrip("/"), timeout=300, headers=auth_headers(api_key)) as http:
        if load:
            loader = "/load_clip_model" if images else "/load_sentence_transformer_model"
            call(http, "POST", loader, {"model_name": model})
        if not images:
            body = {"model": model, "input": texts, "encoding_format": "base64"}
            data = call(http, "POST", "/v1/embeddings", body)["data"]
            vectors = np.array([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data])
            return vectors, np.zeros((0, vectors.shape[1]), np.float32)
        encoded = [base64.b64encode(p.read_bytes()).decode("ascii") for p in images]
        body = call(http, "POST", "/infer", {"model_name": model, "text": texts or None, "image": encoded})
        text = np.array(body["text_embeddings"], dtype=np.float32)
        image = np.array(body["image_embeddings"], dtype=np.float32)
        return text.reshape(len(texts), -1) if texts else np.zeros((0, image.shape[1]), np.float32), image


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("texts", nargs="*")
    parser.add_argument("--url", default=default_url("text_embedding"),
                        help="Triton gRPC address (default: GRPC_PORT, 8001; client/triton_urls.py)")
    parser.add_argument("--gateway", metavar="URL", help="use the HTTP gateway at URL (e.g. http://localhost:8080)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model name for --gateway")
    parser.add_argument("--image", type=Path, nargs="*", default=[], help="image files (with --gateway, CLIP)")
    parser.add_argument("--load", action="store_true", help="load --model before embedding (with --gateway)")
    add_api_key_argument(parser)
    args = parser.parse_args()
    if not args.texts and not args.image:
        parser.error("give at least one text or --image")
    if args.image and not args.gateway:
        parser.error("--image needs --gateway")
    labels = [repr(t[:60]) for t in args.texts] + [f"image {p.name}" for p in args.image]
    try:
        if args.gateway:
            text, image = embed_gateway(args.gateway, args.model, args.texts, args.image, args.load, args.api_key)
            vectors = np.concatenate([text, image]) if len(image) else text
        else:
            from tritonclient.utils import InferenceServerException

            try:
                vectors = embed(args.url, args.texts)
            except InferenceServerException as e:
                raise GatewayError(e.message()) from None
    except (GatewayError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for i, (label, v) in enumerate(zip(labels, vectors)):
        print(f"[{i}] dim={v.shape[0]} norm={np.linalg.norm(v):.6f}  {label}")
    if len(labels) > 1:
        print("cosine similarity:")
        sims = vectors @ vectors.T  # rows are L2-normalized
        for i in range(len(labels)):
            for j in range(i + 1, len(labels)):
                print(f"  [{i}] vs [{j}]: {sims[i, j]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
