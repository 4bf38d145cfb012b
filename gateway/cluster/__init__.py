"""Several gateway replicas acting as one (REDIS_URL): the shared model registry. Without REDIS_URL the
embedded default, gateway/registry.py's single-process registry, is used and redis is never imported."""
from __future__ import annotations

from gateway.registry import ModelRegistry


def make_registry(settings, engine) -> ModelRegistry:
    if not settings.redis_url:
        return ModelRegistry(settings, engine)
    from gateway.cluster.cluster_registry import ClusterRegistry

    return ClusterRegistry(settings, engine)
