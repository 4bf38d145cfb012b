"""The models the gateway serves and their life in Triton: model_registry.py (one gateway process: loads,
LRU cap, unloads, DATA_DIR/models.json), cluster_registry.py with registrations.py (REDIS_URL: several
replicas acting as one, the registered models shared through Redis). `make_registry` picks one; without
REDIS_URL redis is never imported."""
from __future__ import annotations

from gateway.registry.model_registry import KINDS, Entry, ModelRegistry, model_id
from gateway.settings import Settings
from gateway.triton.engine import TritonEngine

__all__ = ["KINDS", "Entry", "ModelRegistry", "make_registry", "model_id"]


def make_registry(settings: Settings, engine: TritonEngine) -> ModelRegistry:
    if not settings.redis_url:
        return ModelRegistry(settings, engine)
    from gateway.registry.cluster_registry import ClusterRegistry

    return ClusterRegistry(settings, engine)
