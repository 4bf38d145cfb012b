"""Issue 53: the generator's LLM-serving accounting (backends/gptj_generator/llm_metrics.py) and its Triton
adapter (llm_metrics_publisher.py, on the fake pb_utils); then the accounting watching a real OpenVINO engine.
The live /metrics check is tests/test_llm_metrics_server.py."""
from __future__ import annotations

import pytest

import fake_pb_utils
from gptj_generator.llm_metrics import PrefixCacheModel, ServingAccount, kv_cache_usage, prefix_cache_model_for
from gptj_generator.llm_metrics_publisher import COUNTERS, HISTOGRAMS, KV_CACHE_USAGE, ServingMetrics
from gptj_generator.seam import EngineStats, GenerationEvent, GenerationRequest

S = 1_000_000_000  # ns


def event(name: str, at_s: float, **attributes) -> GenerationEvent:
    return GenerationEvent(name, int(at_s * S), attributes)


def play(account: ServingAccount, request: GenerationRequest, events: list[GenerationEvent], chained=None) -> None:
    listener = account.watch(request, chained)
    for e in events:
        listener(e)


def test_one_request_s_times_and_tokens():
    account = ServingAccount()
    play(account, GenerationRequest(list(range(10)), 8),
         [event("queued", 100), event("scheduled", 101), event("first_token", 103),
          event("finished", 107, reason="length", completion_tokens=5)])
    drained = account.drain()
    assert drained.queue_time == [1.0]
    assert drained.time_to_first_token == [3.0]  # from queued: the wait for a row counts
    assert drained.request_duration == [7.0]
    assert drained.time_per_output_token == [1.0]  # (107 - 103) / (5 - 1)
    assert (drained.prompt_tokens, drained.completion_tokens) == (10, 5)
    assert (drained.prefix_cache_queries, drained.prefix_cache_hits) == (10, 0)  # no prefix cache: no hits
    assert not account.drain(), "a drain hands over what it counted, once"


def test_requests_that_never_ran_or_failed_count_only_what_happened():
    account = ServingAccount()
    # stopped while it waited for a row: no prefill, no first token
    play(account, GenerationRequest([1, 2, 3], 8), [event("queued", 0), event("finished", 2, reason="cancelled",
                                                                                completion_tokens=0)])
    # failed after 4 tokens: its duration counts, its time per token does not (OpenTelemetry's: successes only)
    play(account, GenerationRequest([1, 2], 8), [event("queued", 0), event("scheduled", 0), event("first_token", 1),
                                                 event("finished", 3, error="RuntimeError()", completion_tokens=4)])
    # one token: no time per output token to speak of
    play(account, GenerationRequest([1], 1), [event("queued", 0), event("scheduled", 0), event("first_token", 1),
                                              event("finished", 1, reason="length", completion_tokens=1)])
    drained = account.drain()
    assert drained.request_duration == [2.0, 3.0, 1.0]
    assert drained.time_to_first_token == [1.0, 1.0]
    assert drained.time_per_output_token == []
    assert drained.prompt_tokens == 3 and drained.completion_tokens == 5
    assert drained.queue_time == [0.0, 0.0]


def test_a_clock_step_back_is_no_negative_time():
    account = ServingAccount()
    play(account, GenerationRequest([1], 4), [event("queued", 10), event("scheduled", 9), event("first_token", 9),
                                              event("finished", 9, reason="length", completion_tokens=3)])
    drained = account.drain()
    assert min(drained.queue_time + drained.time_to_first_token + drained.request_duration
               + drained.time_per_output_token) == 0.0


def test_the_chained_listener_gets_every_event_even_when_the_accounting_fails():
    seen = []
    account = ServingAccount()
    account.prefix_cache = "not a model"  # makes the accounting raise at `scheduled`
    events = [event("queued", 0), event("scheduled", 1), event("first_token", 2),
              event("finished", 3, reason="stop", completion_tokens=2)]
    play(account, GenerationRequest([1, 2], 4), events, chained=seen.append)
    assert seen == events


def test_the_prefix_cache_model_counts_whole_shared_blocks():
    cache = PrefixCacheModel(block_tokens=4)
    served = list(range(100, 111))  # 11 tokens: 2 whole blocks and a partial one
    assert cache.hits(served) == 0
    cache.remember(served)
    assert cache.hits(served + [1, 2, 3]) == 8  # the two whole blocks; the partial one is not named by them
    assert cache.hits(served[:5] + [7, 7, 7, 7]) == 4  # shared up to its 6th token: one whole block
    assert cache.hits([0] + served) == 0  # same tokens at other positions: another prefix
    assert cache.hits(served[:8]) == 7, "the pipeline computes a fully cached prompt's last token"
    assert cache.hits([]) == 0


def test_the_prefix_cache_model_evicts_the_least_recently_used_blocks():
    cache = PrefixCacheModel(block_tokens=2, capacity_blocks=4)
    a, b, c = [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]  # two blocks each
    cache.remember(a)
    cache.remember(b)
    assert cache.hits(a + [9]) == 4  # a is now the most recently used
    cache.remember(c)  # over the bound: b goes
    assert (cache.hits(a + [9]), cache.hits(b + [9]), cache.hits(c + [9])) == (4, 0, 4)
    assert len(cache) == 4


def test_a_cache_that_grows_on_demand_keeps_what_its_busiest_moment_held():
    cache = PrefixCacheModel(block_tokens=2)
    account = ServingAccount(cache)
    prompts = [[n] * 4 for n in range(1, 4)]
    listeners = [account.watch(GenerationRequest(p, 2)) for p in prompts[:2]]
    for listener in listeners:  # two running at once: 2 x (4 + 2) tokens = 6 blocks reserved
        listener(event("queued", 0))
        listener(event("scheduled", 0))
    for listener in listeners:
        listener(event("first_token", 1))
        listener(event("finished", 2, reason="length", completion_tokens=2))
    play(account, GenerationRequest(prompts[2] * 2, 2), [event("queued", 3), event("scheduled", 3),
                                                        event("first_token", 4)])
    assert len(cache) == 6, "bounded by the 6 blocks the two held together"
    assert cache.hits(prompts[0] + [9]) == 0 and cache.hits(prompts[1] + [9]) == 4
    drained = account.drain()
    assert drained.prefix_cache_queries == 16 and drained.prefix_cache_hits == 0


def test_repeated_prompts_hit_and_are_counted():
    account = ServingAccount(PrefixCacheModel(block_tokens=4))
    prompt = list(range(20))
    for start in (0, 10):
        play(account, GenerationRequest(prompt + [start], 4),
             [event("queued", start), event("scheduled", start), event("first_token", start + 1),
              event("finished", start + 2, reason="length", completion_tokens=4)])
    drained = account.drain()
    assert (drained.prefix_cache_queries, drained.prefix_cache_hits) == (42, 20)


class Engine:
    """What the publisher asks of an engine."""

    def __init__(self, active=0, usage=None, prefix_caching=False):
        self.active, self.usage = active, usage
        self._settings = {"prefix_caching": prefix_caching, "kv_cache_tokens": 0}
        if usage is not None:
            self.cache_stats = lambda: {"cache_usage_percent": self.usage}

    def stats(self):
        return EngineStats(self.active, 0, 0, 0, 0.0, 0.0, 0)

    def settings(self):
        return self._settings


class Recorded(fake_pb_utils.MetricFamily):
    made: dict = {}

    def __init__(self, name, description, kind):
        self.name, self.kind = name, kind

    def Metric(self, labels=None, buckets=None):
        metric = fake_pb_utils._Metric()
        Recorded.made[self.name] = (self.kind, dict(labels or {}), buckets, metric)
        return metric


@pytest.fixture
def made(monkeypatch):
    Recorded.made = {}
    monkeypatch.setattr(fake_pb_utils, "MetricFamily", Recorded)
    return Recorded.made


def serve_one(metrics: ServingMetrics, prompt: list[int], start: float, completion: int = 3) -> None:
    listener = metrics.watch(GenerationRequest(prompt, completion))
    for e in [event("queued", start), event("scheduled", start + 0.5), event("first_token", start + 1),
              event("finished", start + 2, reason="length", completion_tokens=completion)]:
        listener(e)


def test_the_publisher_puts_each_figure_on_its_metric(made):
    metrics = ServingMetrics("codegen_generator")
    engine = Engine(usage=25.0)
    metrics.follow(engine)
    assert {name for name, _, _ in HISTOGRAMS} <= set(made) and {name for name, _ in COUNTERS} <= set(made)
    kind, labels, buckets, _ = made["gen_ai_server_time_to_first_token_seconds"]
    assert (kind, labels) == ("histogram", {"model": "codegen_generator"}) and buckets == sorted(buckets)
    serve_one(metrics, [1, 2, 3, 4], 0)
    serve_one(metrics, [5, 6], 10)
    metrics.update(engine)
    assert made["gen_ai_server_time_to_first_token_seconds"][3].observed == [1.0, 1.0]
    assert made["gen_ai_server_request_duration_seconds"][3].observed == [2.0, 2.0]
    assert made["gen_ai_server_time_per_output_token_seconds"][3].observed == [0.5, 0.5]
    assert made["codegen_generator_queue_time_seconds"][3].observed == [0.5, 0.5]
    assert made["codegen_generator_prompt_tokens_total"][3].value == 6
    assert made["codegen_generator_completion_tokens_total"][3].value == 6
    assert made["codegen_generator_prefix_cache_queries_total"][3].value == 6
    assert made[KV_CACHE_USAGE][3].value == 0.25
    metrics.update(engine)  # nothing new: nothing observed twice
    assert made["gen_ai_server_time_to_first_token_seconds"][3].observed == [1.0, 1.0]
    assert made["codegen_generator_completion_tokens_total"][3].value == 6


def test_the_publisher_waits_while_the_engine_is_busy_and_publishes_when_it_is_idle(made):
    metrics = ServingMetrics("codegen_generator", interval_s=3600)
    engine = Engine(active=1)
    metrics.follow(engine)
    assert KV_CACHE_USAGE not in made, "an engine that does not report its KV cache gets no gauge"
    metrics.update(engine)  # the first one publishes (nothing yet)
    serve_one(metrics, [1, 2], 0)
    metrics.update(engine)
    assert made["codegen_generator_completion_tokens_total"][3].value == 0, "busy: published at most every interval"
    engine.active = 0
    metrics.update(engine)
    assert made["codegen_generator_completion_tokens_total"][3].value == 3


def test_prefix_hits_are_modelled_only_for_an_engine_that_caches_prefixes():
    assert prefix_cache_model_for(Engine(prefix_caching=False)) is None
    assert prefix_cache_model_for(object()) is None  # the torch engine says nothing: it caches none
    model = prefix_cache_model_for(Engine(prefix_caching=True))
    assert model is not None and model.capacity_blocks is None  # kv_cache_tokens 0: grows on demand


@pytest.mark.parametrize("kind", ["openvino", "torch"])
def test_the_account_agrees_with_a_real_engine_s_tokens_and_prefix_hits(kind):
    """Each engine watched as model.py watches it (OpenVINO: prefix caching on, prompts prefilled 64 tokens a
    step): the counts are the requests' own; on OpenVINO a prompt extending a served one hits the served prompt's
    whole blocks and its prefill takes fewer steps (the pipeline did reuse them); torch caches no prefix."""
    import inspect
    import textwrap

    from transformers import AutoTokenizer

    from test_codegen_engine import GENERATOR_DIR, Collector, make_engine

    ids = AutoTokenizer.from_pretrained(str(GENERATOR_DIR))(inspect.getsource(textwrap))["input_ids"]
    engine = make_engine(kind, **({"prefill_chunk_tokens": 64} if kind == "openvino" else {}))
    try:
        account = ServingAccount(prefix_cache_model_for(engine))
        sinks, steps = [], []
        for prompt in (ids[:200], ids[:240]):
            request, sink, before = GenerationRequest(prompt, 8), Collector(), engine.steps
            request.on_event = account.watch(request)
            engine.submit(request, sink)
            sinks.append(sink.wait())
            steps.append(engine.steps - before)
        usage = kv_cache_usage(engine)
    finally:
        engine.close()
    drained = account.drain()
    assert all(sink.error is None for sink in sinks)
    assert len(drained.time_to_first_token) == len(drained.request_duration) == 2
    assert drained.completion_tokens == sum(len(sink.ids) for sink in sinks)
    assert drained.prompt_tokens == drained.prefix_cache_queries == 440
    if kind == "torch":
        assert drained.prefix_cache_hits == 0 and usage is None  # its KV cache is no pool of blocks to report
        return
    assert 0 <= usage <= 1
    assert drained.prefix_cache_hits == 192  # 200 tokens served: 6 whole blocks of 32
    assert steps[1] < steps[0], f"the pipeline reused no block ({steps})"


def dashboard_exprs() -> list[str]:
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "codegen-serving.json"
    dashboard = json.loads(path.read_text())
    assert all(p["datasource"]["uid"] == "prometheus" for p in dashboard["panels"])
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_the_dashboard_graphs_every_serving_metric():
    exprs = " ".join(dashboard_exprs())
    for name, _, _ in HISTOGRAMS:
        assert f"histogram_quantile(0.5, sum by (le, model) (rate({name}_bucket" in exprs
        assert f"histogram_quantile(0.95, sum by (le, model) (rate({name}_bucket" in exprs
    for name in [name for name, _ in COUNTERS] + [KV_CACHE_USAGE, "codegen_generator_active_sequences",
                                                    "codegen_generator_pending_requests"]:
        assert name in exprs, name


def test_the_dashboard_s_promql_parses(tmp_path):
    import shutil
    import subprocess

    import yaml

    from tools.deploy_check import substitute_grafana

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (deploy/install_tools.sh installs it)")
    exprs = [substitute_grafana(expr) for expr in dashboard_exprs()]
    rules = tmp_path / "rules.yml"

    def check(expressions: list[str]) -> subprocess.CompletedProcess:
        rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
            {"record": f"dashboard:expr{i}", "expr": expr} for i, expr in enumerate(expressions)]}]}))
        return subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)

    result = check(exprs)
    assert result.returncode == 0, result.stdout + result.stderr
    assert check(exprs + ["sum by (model) (rate(x[1m])"]).returncode != 0, "promtool catches a broken expression"
