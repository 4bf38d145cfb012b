"""GET /health: 200 only when Triton is live, the supervisor reports no unhealthy model, every model the
gateway serves is ready, none is being reloaded into a restarted server and the gateway is not draining;
otherwise 503 naming what is wrong. What works in a degraded way (a quota store whose breaker is open:
limits counted per replica) is listed under `degraded`, without a 503: the replica still serves."""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gateway.dependencies import AdmissionDep, EngineDep, OpenedRegistryDep, QuotasDep, ServerWatchDep, SettingsDep
from supervisor.state import unhealthy_models

router = APIRouter(tags=["service"])


@router.get("/health")
async def health(engine: EngineDep, settings: SettingsDep, registry: OpenedRegistryDep, admission: AdmissionDep,
                 watch: ServerWatchDep, quotas: QuotasDep):
    problems: dict[str, str] = {}
    if admission is not None and admission.draining:  # a load balancer stops sending first
        problems["gateway"] = "shutting down (draining requests in flight)"
    if watch is not None:  # the server down, or models being loaded again into a restarted one
        problems.update(watch.problems())
    if "triton" not in problems and not await engine.live():
        problems["triton"] = "Triton server is not live"
    elif "triton" not in problems:
        if settings.supervisor_state_file:
            problems.update(unhealthy_models(settings.supervisor_state_file))
        # the Triton models the gateway must have ready (the registry's loaded ones)
        for model in (await registry.triton_models_in_use() if registry is not None else []):
            if model not in problems and not await engine.ready(model):
                problems[model] = "not ready"
    degraded = {"degraded": quotas.degraded()} if quotas is not None and quotas.degraded() else {}
    if problems:
        return JSONResponse({"status": "unhealthy", "problems": problems, **degraded}, status_code=503,
                            headers={"Retry-After": "1"})
    return {"status": "ok", **degraded}
