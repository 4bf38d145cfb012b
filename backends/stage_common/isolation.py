"""A failure inside a shared batch fails only the request that caused it."""
from __future__ import annotations

from typing import Any, Callable, Sequence


def each_alone_on_failure(compute: Callable[[list[Any]], list[Any]], batch: Sequence[Any]) -> list[Any]:
    """`compute(batch)`, one result per item. If the shared call raises, each item is computed alone,
    so that only the one that breaks it fails: its exception stands in its place (execute_batched
    turns that into its request's error). A batch of one re-raises as it is."""
    try:
        return compute(list(batch))
    except Exception:  # noqa: BLE001 - retried per item below
        if len(batch) == 1:
            raise
    results: list[Any] = []
    for item in batch:
        try:
            results.append(compute([item])[0])
        except Exception as exc:  # noqa: BLE001 - this item's own failure
            results.append(exc)
    return results
