"""The Triton adapter of llm_metrics.py: its figures as custom metrics on Triton's /metrics (the Python backend's
metrics API; 2.51's has histograms). Names: OpenTelemetry's GenAI server metrics in Prometheus form where the
conventions name one, `codegen_generator_*` for the rest (vLLM's meanings; the gen_ai namespace is the
conventions' own). The running and waiting gauges are model.py's codegen_generator_active_sequences and
codegen_generator_pending_requests. docs/observability.md lists them all."""
from __future__ import annotations

import time

import triton_python_backend_utils as pb_utils

from gptj_generator.llm_metrics import (QUEUE_TIME_BUCKETS, REQUEST_DURATION_BUCKETS, TIME_PER_OUTPUT_TOKEN_BUCKETS,
                                        TIME_TO_FIRST_TOKEN_BUCKETS, ServingAccount, kv_cache_usage,
                                        prefix_cache_model_for)

# (name, help, buckets) per histogram: Drained's field of the same order
HISTOGRAMS = (
    ("gen_ai_server_time_to_first_token_seconds", "time from the generator accepting a request to its first "
     "token (waiting for a row and the prefill included)", TIME_TO_FIRST_TOKEN_BUCKETS),
    ("gen_ai_server_time_per_output_token_seconds", "a request's time per output token after its first "
     "((end - first token) / (output tokens - 1))", TIME_PER_OUTPUT_TOKEN_BUCKETS),
    ("gen_ai_server_request_duration_seconds", "time from the generator accepting a request to its end",
     REQUEST_DURATION_BUCKETS),
    ("codegen_generator_queue_time_seconds", "time a request waited for a row of the decode batch",
     QUEUE_TIME_BUCKETS),
)
COUNTERS = (
    ("codegen_generator_prompt_tokens_total", "prompt tokens of the requests that got a row"),
    ("codegen_generator_completion_tokens_total", "tokens generated (end-of-text not counted)"),
    ("codegen_generator_prefix_cache_queries_total", "prompt tokens looked up in the prefix cache"),
    ("codegen_generator_prefix_cache_hits_total", "prompt tokens whose KV blocks the prefix cache held "
     "(modelled: the pipeline counts none)"),
)
KV_CACHE_USAGE = "codegen_generator_kv_cache_usage_ratio"


class ServingMetrics:
    """Published from the engine's progress callback (its loop thread), after the turn: each metric call is a round
    trip to the server, so at most every `interval_s` while requests run, and at once when the engine is idle."""

    def __init__(self, model_name: str, interval_s: float = 0.2):
        self.labels, self.interval_s = {"model": model_name}, interval_s
        self.account = ServingAccount()
        # a MetricFamily that is garbage-collected takes its metrics off /metrics: they live as long as this object
        self._families = [pb_utils.MetricFamily(name, text, pb_utils.MetricFamily.HISTOGRAM)
                          for name, text, _ in HISTOGRAMS]
        self._histograms = [family.Metric(labels=self.labels, buckets=list(buckets))
                            for family, (_, _, buckets) in zip(self._families, HISTOGRAMS)]
        counters = [pb_utils.MetricFamily(name, text, pb_utils.MetricFamily.COUNTER) for name, text in COUNTERS]
        self._families += counters
        self._counters = [family.Metric(labels=self.labels) for family in counters]
        self._kv_usage = None  # made for an engine that reports its KV cache (follow)
        self._kv_seen: float | None = None
        self._published_at = 0.0

    def follow(self, engine) -> None:
        """What the loaded engine has: a prefix cache to model, a KV cache to report."""
        self.account.prefix_cache = prefix_cache_model_for(engine)
        if hasattr(engine, "cache_stats"):
            family = pb_utils.MetricFamily(KV_CACHE_USAGE, "share of the KV cache's blocks in use at the last step "
                                           "(0..1)", pb_utils.MetricFamily.GAUGE)
            self._families.append(family)
            self._kv_usage = family.Metric(labels=self.labels)

    def watch(self, request, chained=None):
        """The request's `on_event` listener (and `chained`, tracing's, after it)."""
        return self.account.watch(request, chained)

    def update(self, engine) -> None:
        now = time.monotonic()
        if engine.stats().active and now - self._published_at < self.interval_s:
            return
        self._published_at = now
        drained = self.account.drain()
        for metric, values in zip(self._histograms, (drained.time_to_first_token, drained.time_per_output_token,
                                                     drained.request_duration, drained.queue_time)):
            for value in values:
                metric.observe(value)
        for metric, value in zip(self._counters, (drained.prompt_tokens, drained.completion_tokens,
                                                  drained.prefix_cache_queries, drained.prefix_cache_hits)):
            if value:
                metric.increment(value)
        if self._kv_usage is not None:
            usage = kv_cache_usage(engine)
            if usage != self._kv_seen:
                self._kv_usage.set(usage)
                self._kv_seen = usage
