"""GET /health: 200 only when Triton is live, the supervisor reports no unhealthy model, every model the
gateway serves is ready, none is being reloaded into a restarted server and the gateway is not draining;
otherwise 503 naming what is wrong. What works in a degraded way (a quota store whose breaker is open:
limits counted per replica) is listed under `degraded`, without a 503: the replica still serves.

With one Triton server per failure domain (gateway/triton/domains.py) `servers` says each one's state. One
server down while another serves is `degraded` (`triton_codegen`: the codegen server), not a 503: a load
balancer that took the replica out for it would take the embeddings down with the codegen server, which is
what the split is for. The main server (`triton`: the encoders and the gateway's own models) down is a 503."""
from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gateway.build_state import FAILED
from gateway.dependencies import AdmissionDep, EngineDep, OpenedRegistryDep, QuotasDep, ServerWatchDep, SettingsDep
from gateway.supervisor_state import published_settings, unhealthy_models
from gateway.triton.domains import CODEGEN, ENCODERS, domain_of, health_key, servers_of

router = APIRouter(tags=["service"])


@router.get("/health")
async def health(engine: EngineDep, settings: SettingsDep, registry: OpenedRegistryDep, admission: AdmissionDep,
                 watch: ServerWatchDep, quotas: QuotasDep):
    problems: dict[str, str] = {}
    if admission is not None and admission.draining:  # a load balancer stops sending first
        problems["gateway"] = "shutting down (draining requests in flight)"
    if watch is not None:  # a server down, or models being loaded again into a restarted one
        problems.update(watch.problems())
    servers = servers_of(engine)
    for domain, server in servers.items():
        if health_key(domain) not in problems and not await server.live():
            problems[health_key(domain)] = "Triton server is not live"
    live = {domain for domain in servers if health_key(domain) not in problems}
    state_files = {ENCODERS: settings.supervisor_state_file,
                   CODEGEN: settings.codegen_supervisor_state_file or settings.supervisor_state_file}
    for path in {state_files[domain] for domain in live if state_files[domain]}:
        problems.update(unhealthy_models(path))
    if ENCODERS in live:  # the Triton models the gateway must have ready (the registry's loaded ones)
        models = await registry.triton_models_in_use() if registry is not None else []
        ready = await asyncio.gather(*(engine.ready(m) for m in models if domain_of(m) in live))
        problems.update({m: "not ready" for m, ok in zip([m for m in models if domain_of(m) in live], ready)
                         if not ok and m not in problems})
    # a second server down while the main one serves: degraded, not a 503 (the module's docstring)
    degraded = {key: problems.pop(key) for key in [health_key(d) for d in servers if d != ENCODERS]
                if key in problems and ENCODERS in live}
    if quotas is not None and quotas.degraded():
        degraded.update(quotas.degraded())
    builds = admission.builds.builds() if admission is not None and admission.builds is not None else {}
    # a pipeline being built is no problem (its routes say so, with a Retry-After); one that failed is degraded
    degraded.update({f"build_{name}": build.describe() for name, build in builds.items() if build.state == FAILED})
    body = {"servers": {domain: "live" if domain in live else "not live" for domain in servers}}
    # what the live servers' generators run with, as resolved on their CPU (precision, threads: not "auto" or 0)
    engines = {model: found for path in {state_files[d] for d in live if state_files[d]}
               for model, found in published_settings(path).items()}
    body |= {"engines": engines} if engines else {}
    body |= {"builds": {name: build.as_json() for name, build in builds.items()}} if builds else {}
    body |= {"degraded": degraded} if degraded else {}
    if problems:
        return JSONResponse({"status": "unhealthy", "problems": problems, **body}, status_code=503,
                            headers={"Retry-After": "1"})
    return {"status": "ok", **body}
