"""The failure domains: which Triton server holds which model, and the gateway's one engine per server.

A Python-backend server shares its process, its shared-memory locks and its aborts among every model it holds
(Triton 2.51 aborts the whole server after a stub's death, 1 kill in 5 to 10), so `make triton` runs one
server per domain (launcher/stack.py, `TRITON_DOMAINS`): `codegen` (the `codegen*` models: the ensembles,
their fronts and the generator) and `encoders` (everything else: text_embedding, ner, food_captioning and the
models the gateway loads at run time). The rule is the model's name, so the gateway and the launcher agree on
it without a table (the launcher imports it from here).

`DomainEngines` has the TritonEngine's surface, each call going to the engine of its model's domain: the
routers, the embedder and the registry keep calling one engine. With one server (`CODEGEN_GRPC_URL` unset
or equal to `TRITON_GRPC_URL`) both domains share one engine."""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Mapping, Sequence

import numpy as np

from gateway.triton.engine import StreamResponse, TritonEngine

ENCODERS, CODEGEN = "encoders", "codegen"
DOMAINS = (ENCODERS, CODEGEN)  # the first is the main server: the gateway's own models, Triton's public ports


def domain_of(model: str) -> str:
    """`codegen` for the codegen models (`codegen`, `codegen_*`), `encoders` for every other (the runtime
    models are all `emb_*`: gateway/modelgen/sources.py)."""
    return CODEGEN if model == CODEGEN or model.startswith(CODEGEN + "_") else ENCODERS


def servers_of(engine) -> dict:
    """domain -> engine, one per server: a DomainEngines' servers, or a plain engine (a test's) as the one server."""
    servers = getattr(engine, "servers", None)
    return servers() if servers is not None else {ENCODERS: engine}


def health_key(domain: str) -> str:
    """How /health names a server: `triton` for the main one (the name it always had), `triton_<domain>`."""
    return "triton" if domain == ENCODERS else f"triton_{domain}"


class DomainEngines:
    def __init__(self, urls: Mapping[str, str | None], request_timeout_s: float = 300.0):
        main = urls[ENCODERS]
        by_url: dict[str, TritonEngine] = {}  # one engine (channel) per server
        self.engines: dict[str, TritonEngine] = {}
        for domain in DOMAINS:
            url = urls.get(domain) or main
            if url not in by_url:
                by_url[url] = TritonEngine(url, request_timeout_s)
            self.engines[domain] = by_url[url]
        self.main = self.engines[ENCODERS]
        self.url, self.admin_headers, self.request_timeout_s = self.main.url, self.main.admin_headers, request_timeout_s

    def servers(self) -> dict[str, TritonEngine]:
        """One entry per distinct server, by the first domain it serves (one server: {'encoders': ...})."""
        seen: dict[int, str] = {}
        for domain, engine in self.engines.items():
            seen.setdefault(id(engine), domain)
        return {domain: self.engines[domain] for domain in seen.values()}

    def for_model(self, model: str) -> TritonEngine:
        return self.engines[domain_of(model)]

    async def close(self) -> None:
        for engine in self.servers().values():
            await engine.close()

    # -- a model's calls: to its domain's server
    async def infer(self, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str],
                    timeout_s: float | None = None) -> dict[str, np.ndarray]:
        return await self.for_model(model).infer(model, inputs, outputs, timeout_s)

    def stream_infer(self, model: str, inputs: Mapping[str, np.ndarray],
                     timeout_s: float | None = None) -> AsyncIterator[StreamResponse]:
        return self.for_model(model).stream_infer(model, inputs, timeout_s)

    async def ready(self, model: str) -> bool:
        return await self.for_model(model).ready(model)

    async def load(self, model: str, config: str | None = None) -> None:
        await self.for_model(model).load(model, config)

    async def unload(self, model: str, unload_dependents: bool = True) -> None:
        await self.for_model(model).unload(model, unload_dependents)

    async def wait_unloaded(self, model: str, timeout_s: float = 60.0) -> None:
        await self.for_model(model).wait_unloaded(model, timeout_s)

    # -- the server-wide calls
    async def live(self) -> bool:
        """The main server's liveness (the one the registry's models load into); /health and the server watch
        ask each server (`servers()`)."""
        return await self.main.live()

    async def statistics(self, model: str = "") -> dict:
        if model:
            return await self.for_model(model).statistics(model)
        parts = await self._each(lambda engine: engine.statistics())
        return {"model_stats": [m for part in parts for m in part.get("model_stats", [])]}

    async def repository_index(self) -> list[dict]:
        return [m for part in await self._each(lambda engine: engine.repository_index()) for m in part]

    async def _each(self, call) -> list:
        """Every server's answer; a server other than the main one that fails (restarting) is left out, so that
        a codegen crash never fails a call about the encoders' models."""
        servers = self.servers()
        answers = await asyncio.gather(*(call(engine) for engine in servers.values()), return_exceptions=True)
        for domain, answer in zip(servers, answers):
            if isinstance(answer, BaseException) and (domain == ENCODERS or not isinstance(answer, Exception)):
                raise answer
        return [a for a in answers if not isinstance(a, BaseException)]


def engines_for(settings) -> DomainEngines:
    return DomainEngines({ENCODERS: settings.triton_grpc_url, CODEGEN: settings.codegen_grpc_url},
                         settings.request_timeout_s)
