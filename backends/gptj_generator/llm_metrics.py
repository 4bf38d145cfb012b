"""The LLM-serving figures operators graph (time to first token, time per output token, request duration, queue
time, prompt and completion tokens, prefix-cache queries and hits), counted from a request's events (seam.py's
EVENTS: queued, scheduled, first_token, finished), so that every caller of the generator counts: direct Triton
traffic, the ensembles, the BLS fronts and the gateway. No Triton here: llm_metrics_publisher.py puts what
`drain()` returns on Triton's /metrics.

Durations are measured from `queued` (the generator accepted the request), as OpenTelemetry's GenAI server
metrics and vLLM measure them from the request's arrival: time to first token includes the wait for a row.
Time per output token is per request, as OpenTelemetry defines it: (end - first token) / (output tokens - 1).

Prefix-cache hits: OpenVINO GenAI restores a prompt's cached KV blocks when it takes the request
(`restore_cached_blocks`) but counts no hits (its PipelineMetrics has cache usage only, 2026.4), so
PrefixCacheModel counts them as that function finds them: the prompt's leading whole blocks whose content an
earlier prompt had, within a least-recently-used bound of blocks. It is a model of the pipeline's cache, not a
reading of it (docs/observability.md says where it can differ).
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Sequence

_log = logging.getLogger("stage")

# Histogram buckets (seconds): OpenTelemetry's advised boundaries for the GenAI server metrics, stretched upward,
# since a CPU box at this project's shapes waited 9-21 s for a long prompt's first token (issue 53), and per output
# token downward, since the small demo model decodes in ~5 ms a token (tests/test_llm_metrics_server.py prints it).
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                               7.5, 10.0, 20.0, 40.0, 80.0)
TIME_PER_OUTPUT_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                                 0.5, 0.75, 1.0, 2.5, 5.0)
REQUEST_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
                            163.84, 327.68)
QUEUE_TIME_BUCKETS = REQUEST_DURATION_BUCKETS


@dataclass
class Drained:
    """What was counted since the last drain: each histogram's new observations, each counter's increase."""
    time_to_first_token: list[float] = field(default_factory=list)
    time_per_output_token: list[float] = field(default_factory=list)
    request_duration: list[float] = field(default_factory=list)
    queue_time: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, tokens whose KV came from the cache

    def __bool__(self) -> bool:
        return any((self.time_to_first_token, self.time_per_output_token, self.request_duration, self.queue_time,
                    self.prompt_tokens, self.completion_tokens, self.prefix_cache_queries, self.prefix_cache_hits))


class PrefixCacheModel:
    """The prompt blocks a prefix cache holds, least recently used first, at most `capacity_blocks` of them
    (None: `grow_to` sets the bound, as a cache that grows on demand keeps what its peak demand allocated).

    A block is named by a hash chained over the blocks before it, as the pipeline names a block by its whole
    prefix: a hit needs the same tokens in every block up to it."""

    def __init__(self, block_tokens: int, capacity_blocks: int | None = None):
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_blocks
        self._bound = capacity_blocks or 0
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def _chain(self, ids: Sequence[int]):
        digest = 0
        for start in range(0, len(ids) - len(ids) % self.block_tokens, self.block_tokens):
            digest = hash((digest, tuple(ids[start:start + self.block_tokens])))
            yield digest

    def hits(self, ids: Sequence[int]) -> int:
        """Prompt tokens the cache would give: its leading whole blocks that are held; never the whole prompt (the
        pipeline computes at least its last token, for the logits)."""
        found = 0
        for digest in self._chain(ids):
            if digest not in self._blocks:
                break
            self._blocks.move_to_end(digest)  # used: the last to be evicted
            found += self.block_tokens
        return min(found, max(len(ids) - 1, 0))

    def remember(self, ids: Sequence[int]) -> None:
        """A prompt's whole blocks are in the cache now (its prefill is done)."""
        for digest in self._chain(ids):
            self._blocks[digest] = None
            self._blocks.move_to_end(digest)
        self._evict()

    def grow_to(self, blocks: int) -> None:
        """A cache that grows on demand holds at least what its busiest moment allocated."""
        if self.capacity_blocks is None and blocks > self._bound:
            self._bound = blocks

    def _evict(self) -> None:
        while self._bound and len(self._blocks) > self._bound:
            self._blocks.popitem(last=False)

    def __len__(self) -> int:
        return len(self._blocks)


class _Timeline:
    """One request's times (ns, the events' clock) and sizes."""
    __slots__ = ("ids", "max_tokens", "queued", "scheduled", "first_token")

    def __init__(self, ids: Sequence[int], max_tokens: int):
        self.ids, self.max_tokens = ids, max_tokens
        self.queued = self.scheduled = self.first_token = None


def _seconds(start_ns: int | None, end_ns: int) -> float | None:
    # the events carry the wall clock (spans are stamped with it): a step back of the clock is no negative time
    return None if start_ns is None else max(0.0, (end_ns - start_ns) / 1e9)


class ServingAccount:
    """Counts every watched request's events; `drain()` hands over (and forgets) what was counted since the last.
    Events come from two threads (queued on the caller's, the rest on the engine loop's): a lock guards the counts.
    `prefix_cache` (None: the engine caches no prefixes) models the engine's prefix cache for the hit counts."""

    def __init__(self, prefix_cache: PrefixCacheModel | None = None):
        self.prefix_cache = prefix_cache
        self._lock = threading.Lock()
        self._drained = Drained()
        self._reserved_blocks = 0  # KV blocks the running requests may take (prompt + max_tokens)

    def watch(self, request, chained: Callable | None = None) -> Callable:
        """The `on_event` listener for one GenerationRequest (seam.py); `chained` (tracing's) gets each event too."""
        timeline = _Timeline(request.input_ids, request.max_tokens)

        def on_event(event) -> None:
            try:
                self._record(timeline, event)
            except Exception:  # noqa: BLE001 - a metric must never touch the generation, nor the trace
                _log.exception("codegen serving metrics failed on %s (ignored)", event.name)
            if chained is not None:
                chained(event)

        return on_event

    def _record(self, timeline: _Timeline, event) -> None:
        with self._lock:
            drained = self._drained
            if event.name == "queued":
                timeline.queued = event.time_ns
            elif event.name == "scheduled":
                timeline.scheduled = event.time_ns
                drained.queue_time.append(_seconds(timeline.queued, event.time_ns) or 0.0)
                drained.prefix_cache_queries += len(timeline.ids)
                if self.prefix_cache is not None:
                    drained.prefix_cache_hits += self.prefix_cache.hits(timeline.ids)
                    self._reserved_blocks += self._blocks(timeline)
                    self.prefix_cache.grow_to(self._reserved_blocks)
            elif event.name == "first_token":
                timeline.first_token = event.time_ns
                if timeline.queued is not None:
                    drained.time_to_first_token.append(_seconds(timeline.queued, event.time_ns))
                if self.prefix_cache is not None:
                    self.prefix_cache.remember(timeline.ids)
            elif event.name == "finished":
                self._finished(timeline, event)

    def _finished(self, timeline: _Timeline, event) -> None:
        drained = self._drained
        completion = int(event.attributes.get("completion_tokens", 0))
        drained.completion_tokens += completion
        if timeline.scheduled is not None:  # its prompt went in (a request stopped while waiting computed nothing)
            drained.prompt_tokens += len(timeline.ids)
            if self.prefix_cache is not None:
                self._reserved_blocks -= self._blocks(timeline)
        duration = _seconds(timeline.queued, event.time_ns)
        if duration is not None:
            drained.request_duration.append(duration)
        if "error" not in event.attributes and completion > 1 and timeline.first_token is not None:
            drained.time_per_output_token.append(_seconds(timeline.first_token, event.time_ns) / (completion - 1))

    def _blocks(self, timeline: _Timeline) -> int:
        return -(-(len(timeline.ids) + timeline.max_tokens) // self.prefix_cache.block_tokens)

    def drain(self) -> Drained:
        with self._lock:
            drained, self._drained = self._drained, Drained()
        return drained


def prefix_cache_model_for(engine) -> PrefixCacheModel | None:
    """The model of `engine`'s prefix cache, from what it says it runs with (`settings()`: openvino_engine.py);
    None for an engine that caches no prefixes (the torch engine, or prefix caching off)."""
    settings = engine.settings() if hasattr(engine, "settings") else {}
    if not settings.get("prefix_caching"):
        return None
    from gptj_generator.openvino_engine import KV_BLOCK_TOKENS  # the engine that caches prefixes: loaded already

    tokens = int(settings.get("kv_cache_tokens") or 0)  # 0: the cache grows on demand
    return PrefixCacheModel(KV_BLOCK_TOKENS, -(-tokens // KV_BLOCK_TOKENS) if tokens else None)


def kv_cache_usage(engine) -> float | None:
    """The share (0..1) of the engine's KV cache in use at its last step; None where the engine does not say."""
    if not hasattr(engine, "cache_stats"):
        return None
    return float(engine.cache_stats()["cache_usage_percent"]) / 100.0
