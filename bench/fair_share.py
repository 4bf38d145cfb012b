"""Fair shares under a heavy key (issues 55 and 56): a keyed gateway in front of a real Triton, two keys.

- embeddings: the heavy key keeps 8 connections sending 64-input requests; meanwhile the light key sends
  one-sentence requests, one at a time. Goal: >= 90% of the light key's succeed, p50 <= 2 s.
- completions: the heavy key keeps one 64-sequence request in flight (8 prompts x n 8); meanwhile the light
  key sends short completions, one at a time. Goal: >= 90% of the light key's succeed.
- traced: issue 56 item 1's request (8 prompts x n 8, logprobs 5, greedy), sent three times after both phases.
  Goal: each served, and the same tritonserver process ready after each; how many of its spans arrived.

The whole stack traces at 100% (the gateway's sampler always_on, Triton tracing what the gateway samples) to
an OTLP receiver in this process (bench/otlp_receiver.py), as the issue's review ran it (there at 1%): tracing
once crashed Triton on that request (docs/observability.md, "Gaps"). Before the fair queues
(gateway/triton/fair_queue.py) the light key got 503 `overloaded` for most of both phases.

    .venv/bin/python -m bench.fair_share [--seconds 20] [--heavy-tokens 32] [--traced-tokens 32] [--log-dir DIR]
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench import stats
from bench.otlp_receiver import OtlpReceiver
from gateway.telemetry.config import TRITON_SERVICE
from launcher.gateway_process import GatewayProcess
from launcher.processes import free_port
from launcher.triton_server import TritonServer

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
KEYS = {"heavy": "gk-fair-heavy-0123456789", "light": "gk-fair-light-0123456789"}
MODELS = ["text_embedding", "codegen_generator", "codegen", "codegen_stream"]  # codegen: its preprocess
GATEWAY_SERVICE = "gateway-fair-share"
# issue 56 item 1: twice it crashed Triton, traced, from codegen_stream's BLS call into codegen_preprocess
TRACED_HEAVY = {"model": "codegen", "prompt": [f"def heavy_{i}(x):" for i in range(8)], "n": 8, "logprobs": 5,
                "temperature": 0}
TRACED_SEQUENCES = 8 * 8
STAGE_SPANS = ("codegen_preprocess.encode", "codegen_generator.sequence")  # one each per sequence
SPAN_WAIT_S = 60.0  # Triton and the stages export every 0.2 s here, but a loaded box may take much longer


def headers(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


class Record:
    def __init__(self):
        self.statuses: collections.Counter = collections.Counter()
        self.ok_seconds: list[float] = []
        self.all_seconds: list[float] = []

    def add(self, status: str, seconds: float) -> None:
        self.statuses[status] += 1
        self.all_seconds.append(seconds)
        if status == "200":
            self.ok_seconds.append(seconds)

    def line(self, label: str) -> str:
        total = sum(self.statuses.values())
        ok = self.statuses.get("200", 0)
        p50 = stats.percentile(self.all_seconds, 50) if self.all_seconds else float("nan")
        p95 = stats.percentile(self.all_seconds, 95) if self.all_seconds else float("nan")
        return (f"{label:44} {ok:5d}/{total:<5d} ok ({100 * ok / max(total, 1):5.1f}%)  p50 {p50:6.2f}s  "
                f"p95 {p95:6.2f}s  {dict(sorted(self.statuses.items()))}")

    def share_ok(self) -> float:
        return self.statuses.get("200", 0) / max(sum(self.statuses.values()), 1)


async def timed(record: Record, call) -> None:
    started = time.perf_counter()
    try:
        response = await call()
        status = str(response.status_code)
    except httpx.HTTPError as exc:
        status = type(exc).__name__
    record.add(status, time.perf_counter() - started)


async def embeddings_phase(base: str, seconds: float) -> tuple[Record, Record]:
    heavy, light = Record(), Record()
    stop = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=httpx.Limits(max_connections=16)) as client:
        async def heavy_loop(worker: int):
            n = 0
            while time.monotonic() < stop:
                texts = [f"heavy {worker} {n} {i}: a sentence about the tides and the weather" for i in range(64)]
                n += 1
                await timed(heavy, lambda: client.post("/v1/embeddings", json={"model": MODEL, "input": texts},
                                                        headers=headers("heavy")))

        async def light_loop():
            await asyncio.sleep(1.0)  # the heavy key's connections are busy first
            n = 0
            while time.monotonic() < stop:
                n += 1
                await timed(light, lambda: client.post(
                    "/v1/embeddings", json={"model": MODEL, "input": f"light sentence {n} about the sea"},
                    headers=headers("light")))

        await asyncio.gather(*(heavy_loop(w) for w in range(8)), light_loop())
    return heavy, light


async def completions_phase(base: str, seconds: float, heavy_tokens: int) -> tuple[Record, Record]:
    heavy, light = Record(), Record()
    stop = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        async def heavy_loop():
            prompts = [f"def heavy_{i}(x):\n" for i in range(8)]
            while time.monotonic() < stop:
                await timed(heavy, lambda: client.post("/v1/completions", headers=headers("heavy"), json={
                    "model": "codegen", "prompt": prompts, "n": 8, "max_tokens": heavy_tokens,
                    "temperature": 0.8, "seed": 1}))

        async def light_loop():
            await asyncio.sleep(1.0)  # the heavy request holds its 64 sequences first
            n = 0
            while time.monotonic() < stop:
                n += 1
                await timed(light, lambda: client.post("/v1/completions", headers=headers("light"), json={
                    "model": "codegen", "prompt": f"def light_{n}(x):", "max_tokens": 8, "temperature": 0}))

        await asyncio.gather(heavy_loop(), light_loop())
    return heavy, light


def trace_id_of(response: httpx.Response) -> str | None:
    """The trace the gateway answered under (its traceparent header), if it sampled the request."""
    parts = response.headers.get("traceparent", "").split("-")
    return parts[1] if len(parts) == 4 and int(parts[3], 16) & 1 else None


def spans_of(receiver: OtlpReceiver, trace_id: str | None, wait_s: float) -> list:
    """The trace's spans once every sequence's stage spans are in, or those in by `wait_s` (a few sequences
    may have none under load: docs/observability.md, "Gaps")."""
    deadline = time.monotonic() + wait_s
    while True:
        spans = [s for s in receiver.spans() if s.trace_id == trace_id] if trace_id else []
        names = collections.Counter(s.name for s in spans)
        if all(names[n] >= TRACED_SEQUENCES for n in STAGE_SPANS) or time.monotonic() > deadline:
            return spans
        time.sleep(0.2)


class TracedHeavy:
    """One traced send of item 1's request: what came back, whether the same server was up after, its spans."""

    def __init__(self, status: str, seconds: float, choices: int, pid_same: bool, ready: bool, spans: list):
        self.status, self.seconds, self.choices = status, seconds, choices
        self.pid_same, self.ready, self.spans = pid_same, ready, spans

    def served(self) -> bool:
        return self.status == "200" and self.choices == TRACED_SEQUENCES

    def traced(self) -> bool:
        """Spans of both the gateway and Triton arrived under the request's trace."""
        return {GATEWAY_SERVICE, TRITON_SERVICE} <= {s.service for s in self.spans}

    def line(self, number: int) -> str:
        names = collections.Counter(s.name for s in self.spans)
        services = collections.Counter(s.service for s in self.spans)
        stages = ", ".join(f"{n} {names[n]}/{TRACED_SEQUENCES}" for n in STAGE_SPANS)
        return (f"traced heavy request {number}: {self.status} in {self.seconds:.1f} s, {self.choices} choices; "
                f"tritonserver {'same pid' if self.pid_same else 'NEW OR GONE pid'}, "
                f"{'ready' if self.ready else 'NOT ready'}; {len(self.spans)} spans "
                f"(gateway {services[GATEWAY_SERVICE]}, Triton's {services[TRITON_SERVICE]}; {stages})")


def traced_heavy_phase(base: str, server: TritonServer, pid: int, receiver: OtlpReceiver, max_tokens: int,
                       wait_s: float) -> list[TracedHeavy]:
    done = []
    with httpx.Client(base_url=base, headers=headers("heavy"), timeout=900) as client:
        for _ in range(3):
            started = time.perf_counter()
            choices, trace_id = 0, None
            try:
                response = client.post("/v1/completions", json={**TRACED_HEAVY, "max_tokens": max_tokens})
                status, trace_id = str(response.status_code), trace_id_of(response)
                if response.status_code == 200:
                    choices = sum(1 for c in response.json()["choices"] if c["logprobs"]["tokens"])
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            seconds = time.perf_counter() - started
            pid_same = server.process is not None and server.process.poll() is None and server.process.pid == pid
            done.append(TracedHeavy(status, seconds, choices, pid_same, server.is_up(),
                                    spans_of(receiver, trace_id, wait_s)))
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="each phase's length")
    parser.add_argument("--heavy-tokens", type=int, default=32, help="max_tokens of the 64-sequence request")
    parser.add_argument("--traced-tokens", type=int, default=32,
                        help="max_tokens of item 1's traced request (the issue's crash: 512; its test: 32)")
    parser.add_argument("--log-dir", type=Path, help="keep the gateway's and Triton's logs here")
    args = parser.parse_args()
    from gateway.keys import key_line

    with tempfile.TemporaryDirectory(prefix="fair-share-") as tmp:
        tmp = Path(tmp)
        logs = args.log_dir or tmp
        logs.mkdir(parents=True, exist_ok=True)
        keys = tmp / "keys"
        limits = {"rps": 100_000, "concurrency": 256, "tpm": 100_000_000}
        keys.write_text(key_line(KEYS["heavy"], "heavy", "inference", **limits)
                        + key_line(KEYS["light"], "light", "inference", **limits))
        with OtlpReceiver() as receiver, TritonServer(
                http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(), explicit_models=MODELS,
                log_file=logs / "tritonserver.log", extra_repositories=[tmp / "data" / "triton_models"],
                traces_url=receiver.url,  # what `make triton` passes (launcher/stack.py)
                extra_args=["--trace-config", "opentelemetry,bsp_schedule_delay=200"]) as server:
            pid = server.process.pid
            gateway = GatewayProcess(server.grpc_url, port=free_port(), data_dir=tmp / "data",
                                     log_file=logs / "gateway.log", env={
                                         "GATEWAY_API_KEYS_FILE": str(keys),
                                         "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url,
                                         "OTEL_SERVICE_NAME": GATEWAY_SERVICE, "OTEL_TRACES_SAMPLER": "always_on",
                                         "OTEL_BSP_SCHEDULE_DELAY": "200"})
            gateway.start(timeout=180)
            try:
                embed_heavy, embed_light = asyncio.run(embeddings_phase(gateway.url, args.seconds))
                done_heavy, done_light = asyncio.run(completions_phase(gateway.url, args.seconds, args.heavy_tokens))
                traced = traced_heavy_phase(gateway.url, server, pid, receiver, args.traced_tokens, SPAN_WAIT_S)
            finally:
                gateway.stop()
            spans_total = receiver.count
    print(f"bench.fair_share: {args.seconds:g} s per phase, heavy completions max_tokens {args.heavy_tokens}, "
          f"traced at 100% ({spans_total} spans received), traced heavy max_tokens {args.traced_tokens}")
    print(embed_heavy.line("embeddings, heavy key (8 x 64 inputs)"))
    print(embed_light.line("embeddings, light key (1 sentence)"))
    print(done_heavy.line("completions, heavy key (8 prompts x n 8)"))
    print(done_light.line("completions, light key (max_tokens 8)"))
    for number, one in enumerate(traced, 1):
        print(one.line(number))
    embed_p50 = stats.percentile(embed_light.all_seconds, 50) if embed_light.all_seconds else float("inf")
    goals = {"light embeddings >= 90% ok": embed_light.share_ok() >= 0.9,
             "light embeddings p50 <= 2 s": embed_p50 <= 2.0,
             "light completions >= 90% ok": done_light.share_ok() >= 0.9,
             "traced heavy request served 3/3": all(one.served() for one in traced),
             "same Triton up after each": all(one.pid_same and one.ready for one in traced),
             "each traced (gateway + Triton spans)": all(one.traced() for one in traced)}
    for goal, met in goals.items():
        print(f"{goal:37} {'met' if met else 'NOT met'}")
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
