"""Second peer: fastembed (ONNX Runtime, Qdrant's embedding library) behind a small FastAPI app, serving
the project's all-MiniLM-L6-v2 folder offline (its model.onnx, mean pooling, L2-normalized) with an
OpenAI-shaped POST /v1/embeddings, so the benchmark sends it the very bodies it sends the gateway.
Runs in .peers/fastembed-venv (bench/peers/setup_peers.sh), never in the project's venv.

    .peers/fastembed-venv/bin/python bench/peers/fastembed_app.py --model-dir model_repository/text_embedding_encoder/1 --port 9300
"""
from __future__ import annotations

import argparse
import os

import uvicorn
from fastapi import FastAPI
from fastembed import TextEmbedding
from fastembed.common.model_description import ModelSource, PoolingType
from pydantic import BaseModel

NAME = "local/all-MiniLM-L6-v2"


class Body(BaseModel):
    model: str = NAME
    input: str | list[str]


def make_app(model_dir: str, threads: int | None) -> FastAPI:
    # a custom model read from `specific_model_path`: fastembed never downloads it (HF_HUB_OFFLINE is set too)
    TextEmbedding.add_custom_model(model=NAME, pooling=PoolingType.MEAN, normalization=True,
                                   sources=ModelSource(hf=NAME), dim=384, model_file="model.onnx")
    model = TextEmbedding(NAME, specific_model_path=model_dir, threads=threads)
    app = FastAPI()

    @app.post("/v1/embeddings")
    def embeddings(body: Body):  # a plain def: FastAPI runs it in its thread pool, as users write it
        texts = [body.input] if isinstance(body.input, str) else body.input
        vectors = list(model.embed(texts, batch_size=64))
        return {"object": "list", "model": body.model,
                "data": [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    uvicorn.run(make_app(os.path.abspath(args.model_dir), args.threads), host="127.0.0.1", port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
