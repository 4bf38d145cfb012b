"""GET /health: 200 only when Triton is live, the supervisor reports no unhealthy model, every model the
gateway serves is ready, none is being reloaded into a restarted server and the gateway is not draining;
otherwise 503 naming what is wrong."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from supervisor.state import unhealthy_models

router = APIRouter(tags=["service"])


async def served_models(request: Request) -> list[str]:
    """Triton models the gateway must have ready (the registry adds its loaded models here)."""
    registry = getattr(request.app.state, "models", None)
    return list(await registry.triton_models_in_use()) if registry is not None else []


@router.get("/health")
async def health(request: Request):
    engine, settings = request.app.state.engine, request.app.state.settings
    problems: dict[str, str] = {}
    admission = getattr(request.app.state, "admission", None)
    if admission is not None and admission.draining:  # a load balancer stops sending first
        problems["gateway"] = "shutting down (draining requests in flight)"
    watch = getattr(request.app.state, "server_watch", None)
    if watch is not None:  # the server down, or models being loaded again into a restarted one
        problems.update(watch.problems())
    if "triton" not in problems and not await engine.live():
        problems["triton"] = "Triton server is not live"
    elif "triton" not in problems:
        if settings.supervisor_state_file:
            problems.update(unhealthy_models(settings.supervisor_state_file))
        for model in await served_models(request):
            if model not in problems and not await engine.ready(model):
                problems[model] = "not ready"
    if problems:
        return JSONResponse({"status": "unhealthy", "problems": problems}, status_code=503, headers={"Retry-After": "1"})
    return {"status": "ok"}
