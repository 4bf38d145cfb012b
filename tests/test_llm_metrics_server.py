"""Issue 53 through a live tritonserver and gateway: the generator's LLM-serving metrics (llm_metrics.py) on
Triton's /metrics under load, counted for direct Triton traffic and for the gateway's alike: one time to first
token per request served, the token counters equal to the tokens the responses carried, prefix-cache hits for a
resent prompt, and every series the Grafana dashboard (deploy/grafana/codegen-serving.json) graphs."""
from __future__ import annotations

import json
import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration

MODEL = "codegen_generator"
DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "codegen-serving.json"
TTFT = "gen_ai_server_time_to_first_token_seconds"
DURATION = "gen_ai_server_request_duration_seconds"
# code long enough for whole KV blocks (32 tokens) to be shared by the requests that resend it
PROMPT = ("import os\nimport sys\n\n\ndef read_lines(path):\n    with open(path) as handle:\n        return "
          "[line.rstrip() for line in handle]\n\n\ndef count_words(lines):\n    total = 0\n    for line in lines:\n"
          "        total += len(line.split())\n    return total\n\n\ndef main():\n")


def samples(server) -> dict[tuple[str, str], float]:
    """The generator's samples on /metrics: (name, le or "") -> value."""
    with urllib.request.urlopen(server.server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return {(sample.name, sample.labels.get("le", "")): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.labels.get("model") == MODEL}


def delta(after: dict, before: dict, name: str, le: str = "") -> float:
    return after.get((name, le), 0.0) - before.get((name, le), 0.0)


def settled(server, before: dict, requests: int, timeout: float = 120) -> dict:
    """/metrics once `requests` more first tokens and ends are counted. The generator publishes after a turn of its
    loop, and a request's end is counted in the turn that sent its last response: a client can read /metrics
    between the two (CI saw 7 first tokens counted and 6 ends), so both are waited for."""
    deadline = time.monotonic() + timeout
    while True:
        now = samples(server)
        if all(delta(now, before, name) >= requests for name in (TTFT + "_count", DURATION + "_count")) \
                or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


def direct(server, max_tokens: int) -> tuple[int, int]:
    """The `codegen` ensemble over gRPC, token healing off (the generator gets the prompt as the response counts
    it): (prompt_tokens, completion_tokens)."""
    arrays = [("text_input", np.array([[PROMPT.encode()]], np.object_), "BYTES"),
              ("max_tokens", np.array([[max_tokens]], np.int32), "INT32"),
              ("token_healing", np.zeros((1, 1), bool), "BOOL")]
    tensors = []
    for name, array, dtype in arrays:
        tensors.append(grpcclient.InferInput(name, list(array.shape), dtype))
        tensors[-1].set_data_from_numpy(array)
    result = grpcclient.InferenceServerClient(server.grpc_url).infer("codegen", tensors, client_timeout=300)
    return tuple(int(result.as_numpy(name).reshape(-1)[0]) for name in ("prompt_tokens", "completion_tokens"))


@pytest.fixture(scope="module")
def served(gateway):
    gateway.triton.load(MODEL, "codegen", "codegen_stream")
    return gateway


def test_the_serving_metrics_count_every_request_under_load(served):
    server = served.triton
    before = samples(server)
    assert (TTFT + "_count", "") in before, "the histograms are on /metrics from the start"
    with ThreadPoolExecutor(6) as pool:  # six at once: they wait for rows and share decode steps
        counts = list(pool.map(lambda n: direct(server, n), [8, 12, 16, 20, 24, 28]))
    counts.append(direct(server, 16))  # alone, after the others: the prompt's blocks are in the cache
    after = settled(server, before, len(counts))
    served_requests = len(counts)
    assert delta(after, before, TTFT + "_count") == served_requests
    assert delta(after, before, "gen_ai_server_request_duration_seconds_count") == served_requests
    assert delta(after, before, "codegen_generator_queue_time_seconds_count") == served_requests
    assert delta(after, before, TTFT + "_bucket", "+Inf") == served_requests
    assert delta(after, before, "codegen_generator_completion_tokens_total") == sum(c for _, c in counts)
    assert delta(after, before, "codegen_generator_prompt_tokens_total") == sum(p for p, _ in counts)
    assert delta(after, before, "codegen_generator_prefix_cache_queries_total") == sum(p for p, _ in counts)
    hits = delta(after, before, "codegen_generator_prefix_cache_hits_total")
    assert 32 <= hits < sum(p for p, _ in counts), "the resent prompt's whole blocks were cached"
    ttft = delta(after, before, TTFT + "_sum") / served_requests
    duration = delta(after, before, "gen_ai_server_request_duration_seconds_sum") / served_requests
    per_token = (delta(after, before, "gen_ai_server_time_per_output_token_seconds_sum")
                 / delta(after, before, "gen_ai_server_time_per_output_token_seconds_count"))
    assert 0 < ttft < duration < 300 and 0 < per_token < duration
    assert 0 <= after[("codegen_generator_kv_cache_usage_ratio", "")] <= 1
    print(f"\n{served_requests} requests: time to first token {ttft:.3f} s, duration {duration:.3f} s, "
          f"{per_token * 1000:.1f} ms per output token, {hits:.0f} prompt tokens from the prefix cache")


def test_gateway_requests_count_too(served):
    server = served.triton
    before = samples(server)
    bodies = [{"model": "codegen", "prompt": PROMPT, "max_tokens": n, "temperature": 0} for n in (6, 10)]
    usages = []
    for body in bodies:
        response = served.http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        usages.append(response.json()["usage"])
    after = settled(server, before, len(bodies))
    assert delta(after, before, TTFT + "_count") == len(bodies)
    assert delta(after, before, "codegen_generator_completion_tokens_total") == \
        sum(u["completion_tokens"] for u in usages)


def test_every_series_the_dashboard_graphs_is_on_the_metrics_port(served):
    """The live check of deploy/grafana/triton-pipelines.json (tests/test_deploy.py) loads text_embedding only:
    the codegen dashboard's series are checked here, where the generator runs."""
    exprs = [target["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"]
             for target in panel.get("targets", [])]
    names = {name for expr in exprs for name in re.findall(r"\b(?:gen_ai|codegen)_[a-z_]+", expr)}
    on_port = {name for name, _ in samples(served.triton)}
    assert names and names <= on_port, sorted(names - on_port)
