"""codegen: the seed's load test (output lengths 8/32/128/512 at concurrency 1 and 16) on the unary
`codegen` ensemble, time to first token on `codegen_stream`, and a mixed 8/256-token load.

Goals checked (one run): tokens/s at concurrency 16 >= 4x concurrency 1; preprocessing +
postprocessing <= 2% of compute; 8-token p50 under a mixed 8/256 load <= 2x its idle p50.
The generator is decoupled and batches per decode step inside the model, so Triton's own counts
see one execution per enqueue; the decode steps, rows per step and compute time come from the
generator's custom metrics (codegen_decode_steps, codegen_decode_rows, codegen_compute_duration_us).
"""
from __future__ import annotations

import itertools
import statistics
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from generate import request_inputs
from perf import run_load

MODELS = ["codegen_generator", "codegen", "codegen_stream"]
STAGES = ["codegen_preprocess", "codegen_collect", "codegen_postprocess", "codegen_generator"]
PRE_POST = ["codegen_preprocess", "codegen_postprocess"]
PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\n\ndef main(argv):\n",
           "class LRUCache:\n    def __init__(self, capacity):\n", "# parse a CSV file\nwith open(path) as f:\n"]
LENGTHS = (8, 32, 128, 512)
CUSTOM = ("codegen_decode_steps", "codegen_decode_rows", "codegen_compute_duration_us")


def metrics_url(ctx) -> str:
    """The server's /metrics: from the bench context, or the running server's command line."""
    if getattr(ctx, "metrics_url", None):
        return ctx.metrics_url
    host = ctx.grpc_url.rsplit(":", 1)[0]
    port = "8002"
    if ctx.server_pid is not None:
        args = Path(f"/proc/{ctx.server_pid}/cmdline").read_bytes().decode().split("\0")
        port = next((a.split("=", 1)[1] for a in args if a.startswith("--metrics-port=")), port)
    return f"http://{host}:{port}/metrics"


def generator_metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        lines = response.read().decode().splitlines()
    out = {}
    for line in lines:
        name = line.split("{", 1)[0]
        if name in CUSTOM and 'model="codegen_generator"' in line:
            out[name] = float(line.rsplit(" ", 1)[1])
    return out


def execution_compute_us(url: str, models: list[str]) -> dict[str, float]:
    """Time each model spent executing (batch statistics: once per execution, where the per-request
    statistics count a batched execution once for every request in it)."""
    client = grpcclient.InferenceServerClient(url)
    out = {}
    for model in models:
        stats = client.get_inference_statistics(model).model_stats[0]
        out[model] = sum(b.compute_infer.ns for b in stats.batch_stats) / 1e3
    return out


def inputs_factory(max_tokens: int):
    prompts = itertools.cycle(PROMPTS)
    return lambda: request_inputs(next(prompts), max_tokens)


def window_for(ctx, max_tokens: int, concurrency: int) -> float:
    """Long enough for several whole requests (only requests inside the window count)."""
    per_request = 0.004 * max_tokens * (1 + concurrency / 4)  # rough seconds per request on this CPU
    return max(ctx.window, 4 * per_request) if not ctx.quick else max(ctx.window, 2 * per_request)


def time_to_first_token(url: str, max_tokens: int, concurrency: int) -> list[float]:
    """`concurrency` streams started together: seconds from send to the first piece of text."""
    firsts: list[float] = []
    lock = threading.Lock()

    def one(prompt: str) -> None:
        client = grpcclient.InferenceServerClient(url)
        got_first, done = threading.Event(), threading.Event()
        start = time.perf_counter()

        def callback(result, error):
            if error is not None:
                done.set()
                return
            response = result.get_response()
            if response.outputs and not got_first.is_set():
                got_first.set()
                with lock:
                    firsts.append(time.perf_counter() - start)
            if response.parameters["triton_final_response"].bool_param:
                done.set()

        client.start_stream(callback=callback)
        client.async_stream_infer("codegen_stream", request_inputs(prompt, max_tokens),
                                  enable_empty_final_response=True)
        done.wait(600)
        client.stop_stream()

    threads = [threading.Thread(target=one, args=(PROMPTS[i % len(PROMPTS)],)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return firsts


def mixed_load(url: str, seconds: float, long_clients: int = 8) -> list[float]:
    """8-token requests (one client) while `long_clients` clients keep 256-token requests running."""
    stop = threading.Event()
    short: list[float] = []

    def long_client(i: int) -> None:
        client = grpcclient.InferenceServerClient(url)
        while not stop.is_set():
            client.infer("codegen", request_inputs(PROMPTS[i % len(PROMPTS)], 256))

    longs = [threading.Thread(target=long_client, args=(i,)) for i in range(long_clients)]
    for t in longs:
        t.start()
    time.sleep(2.0)  # the long generations are under way
    client = grpcclient.InferenceServerClient(url)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        client.infer("codegen", request_inputs(PROMPTS[0], 8))
        short.append(time.perf_counter() - t0)
    stop.set()
    for t in longs:
        t.join()
    return short


def run(ctx) -> None:
    murl = metrics_url(ctx)
    lengths = (8, 128) if ctx.quick else LENGTHS
    rows = []
    for max_tokens in lengths:
        for concurrency in (1, 16):
            before, executed_before = generator_metrics(murl), execution_compute_us(ctx.grpc_url, PRE_POST)
            started = time.monotonic()
            result = run_load(ctx.grpc_url, "codegen", inputs_factory(max_tokens), concurrency,
                              window_for(ctx, max_tokens, concurrency), ctx.warmup, stats_models=["codegen"] + STAGES)
            elapsed = time.monotonic() - started
            after, executed_after = generator_metrics(murl), execution_compute_us(ctx.grpc_url, PRE_POST)
            delta = {k: after.get(k, 0) - before.get(k, 0) for k in CUSTOM}
            server = result.server
            generator_us = delta["codegen_compute_duration_us"]
            pre, post = (executed_after[m] - executed_before[m] for m in PRE_POST)
            compute = pre + post + generator_us
            # the seed's way: nv_inference_compute_infer_duration_us, summed per request
            pre_rq, post_rq = (server[m]["compute_infer_total_us"] for m in PRE_POST)
            lat = result.latencies
            row = dict(
                max_tokens=max_tokens, concurrency=concurrency, requests=len(lat), errors=result.errors,
                rps=result.throughput, tokens_per_s=result.throughput * max_tokens,
                mean_ms=statistics.fmean(lat) * 1e3 if lat else float("nan"),
                p95_ms=result.percentile(95) * 1e3,
                gen_inferences=server["codegen_generator"]["inference_count"],
                gen_executions=server["codegen_generator"]["execution_count"],
                steps=delta["codegen_decode_steps"],
                rows_per_step=delta["codegen_decode_rows"] / max(delta["codegen_decode_steps"], 1),
                pre_pct=100 * pre / compute if compute else float("nan"),
                post_pct=100 * post / compute if compute else float("nan"),
                per_request_pct=100 * (pre_rq + post_rq) / (pre_rq + post_rq + generator_us) if generator_us else 0,
                engine_busy=generator_us / 1e6 / elapsed,
            )
            firsts = time_to_first_token(ctx.grpc_url, max_tokens, concurrency)
            row["ttft_ms"] = statistics.median(firsts) * 1e3 if firsts else float("nan")
            rows.append(row)
            print(f"max_tokens {max_tokens:3d} concurrency {concurrency:2d}: {row['rps']:6.2f} req/s, "
                  f"{row['tokens_per_s']:7.1f} tokens/s, latency mean {row['mean_ms']:7.0f} ms p95 "
                  f"{row['p95_ms']:7.0f} ms, TTFT (streamed, p50) {row['ttft_ms']:5.0f} ms "
                  f"[{row['requests']} requests{', %d errors' % row['errors'] if row['errors'] else ''}]",
                  flush=True)
            print(f"    generator: nv_inference_count {row['gen_inferences']} vs nv_inference_exec_count "
                  f"{row['gen_executions']}; {row['steps']:.0f} decode steps, {row['rows_per_step']:.1f} rows/step, "
                  f"decode loop busy {100 * row['engine_busy']:.0f}% of the time", flush=True)
            print(f"    compute: preprocess {row['pre_pct']:.2f}% + postprocess {row['post_pct']:.2f}% (per execution; "
                  f"{row['per_request_pct']:.2f}% together summed per request, as the seed's metric)", flush=True)
    print()
    for max_tokens in lengths:
        one, many = (next(r for r in rows if r["max_tokens"] == max_tokens and r["concurrency"] == c) for c in (1, 16))
        ratio = many["tokens_per_s"] / one["tokens_per_s"] if one["tokens_per_s"] else float("nan")
        print(f"goal tokens/s c16 >= 4x c1, max_tokens {max_tokens}: {ratio:.1f}x "
              f"{'OK' if ratio >= 4 else 'MISSED'}")
    share = max(r["pre_pct"] + r["post_pct"] for r in rows)
    print(f"goal pre+post <= 2% of compute: worst {share:.2f}% {'OK' if share <= 2 else 'MISSED'}")
    idle = [r for r in rows if r["max_tokens"] == 8 and r["concurrency"] == 1][0]
    idle_p50 = float(np.median(run_load(ctx.grpc_url, "codegen", inputs_factory(8), 1, 3.0, 0.5,
                                        stats_models=["codegen"]).latencies))
    short = mixed_load(ctx.grpc_url, 5.0 if ctx.quick else 10.0)
    mixed_p50 = statistics.median(short)
    print(f"goal mixed 8/256 load: 8-token p50 {mixed_p50 * 1e3:.0f} ms vs idle {idle_p50 * 1e3:.0f} ms "
          f"({mixed_p50 / idle_p50:.1f}x, idle c1 run mean {idle['mean_ms']:.0f} ms) "
          f"{'OK' if mixed_p50 <= 2 * idle_p50 else 'MISSED'}")
    print(flush=True)
