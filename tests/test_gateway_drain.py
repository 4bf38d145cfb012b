"""SIGTERM to a live gateway with 8 completions streams open and a steady embeddings load: /health turns
503 first, new requests get 503 with Retry-After, every request admitted before the signal completes
or ends with an explicit error (a streamed error event at the drain deadline), and the gateway exits."""
from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from codegen_engines import load_generator_with_engine, long_prompt
from launcher.gateway_process import GatewayProcess
from launcher.processes import free_port

pytestmark = pytest.mark.integration
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
DRAIN_S = 2


def test_sigterm_drains(triton, tmp_path):
    triton.load("text_embedding", "codegen_generator", "codegen", "codegen_stream")
    # The streams must still be open at the deadline, 2 + DRAIN_S s after they start: requests that run to their
    # 512 tokens (long_prompt: whatever the demo model writes), on the torch engine: on OpenVINO the eight streams
    # of the demo model ended before the deadline (it runs the demo model several times faster than torch).
    prompt = long_prompt(triton.grpc_url)
    load_generator_with_engine(triton.client, "torch")
    try:
        drain_with_streams(triton, tmp_path, prompt)
    finally:
        load_generator_with_engine(triton.client, "auto")  # as shipped, for the modules after this one


def drain_with_streams(triton, tmp_path, prompt: str) -> None:
    gateway = GatewayProcess(triton.grpc_url, port=free_port(), data_dir=tmp_path / "data",
                             log_file=tmp_path / "gateway.log", env={"PRELOAD_MODELS": "", "DRAIN_S": str(DRAIN_S)})
    gateway.start(timeout=180)
    streams: list[dict] = []
    embeddings: list[tuple[float, float, int | None, str]] = []
    stop = threading.Event()
    signalled_at = [float("inf")]

    def stream_client():
        record = {"start": time.time(), "status": None, "events": [], "error": None}
        try:
            with httpx.Client(base_url=gateway.url, timeout=120) as http:
                # long enough to be open at the deadline: a prompt the demo model runs to max_tokens (it ends a
                # function early, docs/demo-models.md)
                with http.stream("POST", "/v1/completions", json={"model": "codegen", "prompt": prompt,
                                                                  "max_tokens": 512, "stream": True}) as r:
                    record["status"] = r.status_code
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            record["events"].append(line[6:])
        except httpx.HTTPError as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"
        streams.append(record)

    def embeddings_client():
        with httpx.Client(base_url=gateway.url, timeout=60) as http:
            while not stop.is_set():
                start = time.time()
                try:
                    r = http.post("/v1/embeddings", json={"model": MINILM, "input": ["a steady load sentence"]})
                    embeddings.append((start, time.time(), r.status_code, r.headers.get("retry-after", "")))
                except httpx.HTTPError as exc:  # a refused connection after the exit is expected
                    embeddings.append((start, time.time(), None, type(exc).__name__))
                    if start > signalled_at[0]:
                        return
                    time.sleep(0.1)

    loaders = [threading.Thread(target=embeddings_client, daemon=True) for _ in range(4)]
    streamers = [threading.Thread(target=stream_client, daemon=True) for _ in range(8)]
    threads = loaders + streamers
    try:
        for thread in loaders:
            thread.start()
        probe = httpx.Client(base_url=gateway.url, timeout=30)
        deadline = time.time() + 120
        while sum(1 for _ in embeddings) < 20 and time.time() < deadline:
            time.sleep(0.2)
        for thread in streamers:  # just before the signal: open, sending, far from their 512 tokens
            thread.start()
        time.sleep(2)
        signalled_at[0] = time.time()
        gateway.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        health = probe.get("/health")
        refused = probe.post("/v1/embeddings", json={"model": MINILM, "input": ["new"]})
        probe.close()
        assert gateway.process.wait(DRAIN_S + 30) == 0
        exited_at = time.time()
        stop.set()
        for thread in threads:
            thread.join(60)
    finally:
        stop.set()
        gateway.stop()
    assert health.status_code == 503 and "gateway" in health.json()["problems"], health.text
    assert refused.status_code == 503 and refused.headers["retry-after"], refused.text
    assert refused.json()["error"]["code"] == "shutting_down"
    assert exited_at - signalled_at[0] < DRAIN_S + 15
    # every stream admitted before the signal: complete ([DONE]) or ended by an explicit error event
    assert len(streams) == 8
    ended_by_error = 0
    for record in streams:
        assert record["status"] == 200 and record["error"] is None, record
        last = record["events"][-1]
        if last != "[DONE]":
            assert json.loads(last)["error"]["code"] == "shutting_down", last
            ended_by_error += 1
    assert ended_by_error, ("no stream was still open at the drain deadline: the test proves nothing about them",
                           [(len(r["events"]), r["events"][-2:]) for r in streams])
    # embeddings: admitted before the signal -> 200; after it -> 503 with Retry-After, or no connection at all
    # once the gateway has exited
    before = [e for e in embeddings if e[1] < signalled_at[0]]
    assert before and all(code == 200 for _, _, code, _ in before)
    for start, end, code, retry in embeddings:
        assert code in (200, 503, None), (start - signalled_at[0], code)
        if code == 503:
            assert start > signalled_at[0] - 0.5 and retry, (start - signalled_at[0], retry)
        if code is None:
            assert start > signalled_at[0], start - signalled_at[0]
    print(f"\ndrain: {ended_by_error} of 8 streams ended by the deadline's error event, "
          f"{sum(1 for e in embeddings if e[2] == 503)} embeddings refused with 503 while draining, "
          f"exit {exited_at - signalled_at[0]:.1f}s after SIGTERM (DRAIN_S={DRAIN_S})")
