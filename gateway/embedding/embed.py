"""Embeddings through the registry: bounds checked first, rows sent to the model's ensemble in Triton
requests of at most its max_batch_size (concurrently, or shared with other requests' rows by the
ensemble's Coalescer), results optionally L2-normalized."""
from __future__ import annotations

import asyncio

import numpy as np

from gateway.errors import BadRequest, PayloadTooLarge
from gateway.modelgen import ModelSpec
from gateway.registry import ModelRegistry
from gateway.settings import Settings
from gateway.triton.coalesce import Coalescer
from gateway.triton.engine import TritonEngine, string_rows

MAX_COALESCERS = 64
# rows waiting in the gateway per ensemble, as each ensemble's max_queue_size in Triton: over it, 503 at once
COALESCE_QUEUE_ROWS = 256


def check_count(items: list, settings, what: str) -> None:
    if not items:
        raise BadRequest(f"{what} is empty", param=what)
    if len(items) > settings.max_inputs:
        raise BadRequest(f"{what} has {len(items)} items, over the limit of {settings.max_inputs} (MAX_INPUTS)",
                         param=what)


def check_texts(texts: list[str], settings, what: str = "input") -> None:
    check_count(texts, settings, what)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise BadRequest(f"{what}[{i}] is not a string", param=what)
        if not text.strip():
            raise BadRequest(f"{what}[{i}] is empty", param=what)
        if len(text) > settings.max_text_bytes or len(text.encode("utf-8")) > settings.max_text_bytes:
            raise PayloadTooLarge(f"{what}[{i}] is over {settings.max_text_bytes} bytes (MAX_TEXT_BYTES)", param=what)


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    return (vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)).astype(np.float32)


async def run_ensemble(engine: TritonEngine, model: str, input_name: str, items: list, max_batch: int) -> np.ndarray:
    chunks = [items[i:i + max_batch] for i in range(0, len(items), max_batch)]
    if len(chunks) == 1:  # the common case: no gather, no task; a copy, as concatenate makes (the output is a
        # read-only view of the gRPC message)
        return np.array((await engine.infer(model, {input_name: string_rows(chunks[0])}, ["embedding"]))["embedding"],
                        dtype=np.float32)
    results = await asyncio.gather(*(engine.infer(model, {input_name: string_rows(chunk)}, ["embedding"])
                                     for chunk in chunks))
    return np.concatenate([r["embedding"] for r in results]).astype(np.float32, copy=False)


class Embedder:
    """What the embedding endpoints and image search call: one app's settings, model registry and Triton
    engine, and `coalescers`, the Coalescer of each ensemble (gateway/triton/coalesce.py), shared by every
    request of the app (gateway/dependencies.py builds an Embedder per request around the app's table)."""

    def __init__(self, settings: Settings, models: ModelRegistry, engine: TritonEngine, coalescers: dict):
        self.settings, self.models, self.engine, self.coalescers = settings, models, engine, coalescers

    def _coalescer(self, model: str, input_name: str, max_batch: int) -> Coalescer | None:
        """The ensemble's Coalescer, or None with COALESCE_CALLS=0."""
        calls = self.settings.coalesce_calls
        if calls <= 0:
            return None
        table, key = self.coalescers, (model, input_name, max_batch)
        found = table.get(key)
        if found is None:
            if len(table) >= MAX_COALESCERS:  # models come and go at runtime: forget the idle ones
                for idle in [k for k, c in table.items() if not c.pending and not c.calls]:
                    del table[idle]
            engine = self.engine
            found = table[key] = Coalescer(
                lambda items: run_ensemble(engine, model, input_name, items, max_batch), max_batch, calls,
                max_pending=COALESCE_QUEUE_ROWS, name=model)
        return found

    async def _embed(self, model: str, input_name: str, items: list, max_batch: int) -> np.ndarray:
        coalescer = self._coalescer(model, input_name, max_batch)
        if coalescer is None:
            return await run_ensemble(self.engine, model, input_name, items, max_batch)
        return await coalescer.run(items)

    async def model_spec(self, model_name: str, pretrained: str | None = None) -> ModelSpec:
        async with self.models.use(model_name, pretrained) as spec:
            return spec

    async def embed_texts(self, model_name: str, texts: list[str], pretrained: str | None = None,
                          normalize: bool = True) -> np.ndarray:
        check_texts(texts, self.settings)
        async with self.models.use(model_name, pretrained) as spec:
            if not spec.text_model:
                raise BadRequest(f"model '{model_name}' does not embed text", param="model")
            vectors = await self._embed(spec.text_model, "text", texts, spec.max_batch_size)
        return l2_normalize(vectors) if normalize and not spec.normalized else vectors

    async def embed_images(self, model_name: str, images: list[bytes], pretrained: str | None = None,
                           normalize: bool = True) -> np.ndarray:
        """`images`: encoded bytes already checked by gateway.embedding.images.image_bytes."""
        check_count(images, self.settings, "image")
        async with self.models.use(model_name, pretrained) as spec:
            if not spec.image_model:
                raise BadRequest(f"model '{model_name}' does not embed images (load a CLIP model for images)",
                                 param="model")
            vectors = await self._embed(spec.image_model, "image", images, spec.max_batch_size)
        return l2_normalize(vectors) if normalize and not spec.normalized else vectors
