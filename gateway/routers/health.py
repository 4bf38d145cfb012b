"""GET /health: 200 only when Triton is live, the supervisor reports no unhealthy model, and every
model the gateway serves is ready; otherwise 503 naming what is wrong."""
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
    if not await engine.live():
        problems["triton"] = "Triton server is not live"
    else:
        if settings.supervisor_state_file:
            problems.update(unhealthy_models(settings.supervisor_state_file))
        for model in await served_models(request):
            if model not in problems and not await engine.ready(model):
                problems[model] = "not ready"
    if problems:
        return JSONResponse({"status": "unhealthy", "problems": problems}, status_code=503, headers={"Retry-After": "1"})
    return {"status": "ok"}
