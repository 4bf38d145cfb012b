"""Embeddings through the registry: bounds checked first, rows sent to the model's ensemble in batches of
its max_batch_size, one batch after another (each alone, or shared with other requests' rows by the
ensemble's Coalescer), results optionally L2-normalized. Inputs are measured in tokens against the model's
maximum sequence length when the caller wants `usage` or refuses over-long inputs (gateway/embedding/lengths.py)."""
from __future__ import annotations

import asyncio

import numpy as np

from gateway.embedding import offload
from gateway.embedding.lengths import tokens_seen
from gateway.embedding.tokens import token_lengths
from gateway.errors import BadRequest, Conflict, PayloadTooLarge
from gateway.modelgen import ModelSpec
from gateway.registry import ModelRegistry
from gateway.settings import Settings
from gateway.triton.coalesce import Coalescer
from gateway.triton.engine import TritonEngine, string_rows

MAX_COALESCERS = 64
INLINE_COUNT_CHARS = 1024  # up to ~0.4 ms (ASCII) of tokenizing on the event loop; more goes to the CPU pool


def check_count(items: list, settings, what: str) -> None:
    if not items:
        raise BadRequest(f"{what} is empty", param=what)
    if len(items) > settings.max_inputs:
        raise BadRequest(f"{what} has {len(items)} items, over the limit of {settings.max_inputs} (MAX_INPUTS)",
                         param=what)


def check_texts(texts: list[str], settings, what: str = "input") -> None:
    check_count(texts, settings, what)
    total = 0
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise BadRequest(f"{what}[{i}] is not a string", param=what)
        if not text.strip():
            raise BadRequest(f"{what}[{i}] is empty", param=what)
        size = len(text) if len(text) > settings.max_text_bytes else len(text.encode("utf-8"))
        if size > settings.max_text_bytes:
            raise PayloadTooLarge(f"{what}[{i}] is over {settings.max_text_bytes} bytes (MAX_TEXT_BYTES)", param=what)
        total += size
    if total > settings.max_request_text_bytes:
        raise PayloadTooLarge(f"{what} holds {total} bytes of text, over the limit of "
                              f"{settings.max_request_text_bytes} per request (MAX_REQUEST_TEXT_BYTES): send fewer "
                              f"or shorter texts", param=what)


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    return (vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)).astype(np.float32)


async def run_ensemble(engine: TritonEngine, model: str, input_name: str, items: list) -> np.ndarray:
    """One Triton request of `items` (at most the ensemble's max batch: Embedder._embed and the Coalescer
    send no more); a copy, as the output is a read-only view of the gRPC message."""
    return np.array((await engine.infer(model, {input_name: string_rows(items)}, ["embedding"]))["embedding"],
                    dtype=np.float32)


def measure(spec: ModelSpec, texts: list[str], truncate: bool, what: str = "input") -> int | None:
    """Tokens the model sees for `texts`; a 400 for one over its maximum sequence length unless `truncate`
    (None, and nothing refused, when the model has no tokenizer.json to count with: its stage truncates)."""
    lengths = token_lengths(spec, texts)
    return None if lengths is None else tokens_seen(lengths, spec.max_tokens, truncate, what)


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
            engine, settings = self.engine, self.settings
            rows = max(settings.coalesce_queue_rows, max_batch)  # a whole batch always fits an empty queue
            share = settings.coalesce_queue_key_rows or max(rows // 2, max_batch)
            found = table[key] = Coalescer(
                lambda items: run_ensemble(engine, model, input_name, items), max_batch, calls,
                max_pending=rows, max_owner_pending=max(min(share, rows), max_batch),
                timeout_s=settings.queue_timeout_s, name=model)
        return found

    async def _embed(self, model: str, input_name: str, items: list, max_batch: int, owner=None) -> np.ndarray:
        """Rows in batches of the ensemble's max batch, one batch after another: a large request (up to
        MAX_INPUTS, 2,048) has at most one batch waiting in the Coalescer or in Triton at a time, and the
        requests that arrive meanwhile go between its batches instead of behind all of its rows. `owner` (an
        API key's id, or a client address; None: nobody's in particular): whose share of the Coalescer's queue
        its rows count against (COALESCE_QUEUE_KEY_ROWS), and whose turn in its round-robin."""
        coalescer = self._coalescer(model, input_name, max_batch)
        batches = []
        for start in range(0, len(items), max_batch):
            batch = items[start:start + max_batch]
            batches.append(await (coalescer.run(batch, owner) if coalescer is not None
                                  else run_ensemble(self.engine, model, input_name, batch)))
        return batches[0] if len(batches) == 1 else np.concatenate(batches)

    async def model_spec(self, model_name: str, pretrained: str | None = None) -> ModelSpec:
        async with self.models.use(model_name, pretrained) as spec:
            return spec

    async def embed_texts(self, model_name: str, texts: list[str], pretrained: str | None = None,
                          normalize: bool = True, truncate: bool = True, what: str = "input") -> np.ndarray:
        """Vectors of `texts`; with `truncate` False an input over the model's maximum sequence length is
        a 400 (image search's texts are cut to it, as CLIP does). `what`: the field, as errors name it."""
        check_texts(texts, self.settings, what)
        async with self.models.use(model_name, pretrained) as spec:
            vectors, _tokens = await self.embed_measured(spec, texts, truncate, normalize, count=False, what=what)
        return vectors

    async def embed_measured(self, spec: ModelSpec, texts: list[str], truncate: bool, normalize: bool = True,
                             count: bool = True, what: str = "input", owner=None) -> tuple[np.ndarray, int | None]:
        """(vectors, tokens the model saw) of `texts`, already bounded by check_texts, on the model `spec`
        (held by the caller's `use`); tokens are counted when `count` or to refuse over-long inputs
        (`truncate` False), else None. A few sentences are counted on the loop before any Triton work;
        large inputs in the CPU pool while Triton embeds them (counting 64 KiB takes ~23 ms), and a refusal
        cancels the embedding."""
        if not spec.text_model:
            raise Conflict(f"model '{spec.model_name}' does not embed text", param="model")  # the model's kind: 409

        def embed():
            return self._embed(spec.text_model, "text", texts, spec.max_batch_size, owner)

        tokens = None
        if truncate and not count:
            vectors = await embed()
        elif sum(map(len, texts)) <= INLINE_COUNT_CHARS:
            # counting a few sentences (~45 us for 170 bytes) costs less than the pool's thread hop
            tokens = measure(spec, texts, truncate, what)
            vectors = await embed()
        else:
            embedding = asyncio.ensure_future(embed())
            try:
                tokens = await offload.run(measure, spec, texts, truncate, what)
                vectors = await embedding
            finally:
                if not embedding.done():  # refused (or the client left): no more batches for it
                    embedding.cancel()
                    await asyncio.gather(embedding, return_exceptions=True)
        return (l2_normalize(vectors) if normalize and not spec.normalized else vectors), tokens

    async def embed_images(self, model_name: str, images: list[bytes], pretrained: str | None = None,
                           normalize: bool = True) -> np.ndarray:
        """`images`: encoded bytes already checked by gateway.embedding.images.image_bytes."""
        check_count(images, self.settings, "image")
        async with self.models.use(model_name, pretrained) as spec:
            if not spec.image_model:
                raise Conflict(f"model '{model_name}' does not embed images (load a CLIP model for images)",
                                 param="model")
            vectors = await self._embed(spec.image_model, "image", images, spec.max_batch_size)
        return l2_normalize(vectors) if normalize and not spec.normalized else vectors
