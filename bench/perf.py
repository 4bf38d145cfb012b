"""The project's own load generator, in perf_analyzer's layout: closed-loop async gRPC load on any model at a
range of concurrencies, client percentiles, and the server-side breakdown from the statistics API. Triton's
perf_analyzer itself (from the tritonclient 2.51 wheel, in .perf-tools/) runs beside it in
bench/bench_perf_analyzer.py, on the same models.

    python -m bench.perf -m text_embedding --concurrency 1,8,32 --text "a sentence"
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import time
from pathlib import Path
from typing import Callable

import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio

from bench import load, stats
from bench.load import LoadResult  # noqa: F401 - bench/perf.py's result, as its importers knew it
from client.string_tensors import string_rows
from client.triton_urls import default_url

InputsFactory = Callable[[], list]  # returns fresh grpcclient.InferInput objects for one request


def stats_snapshot(client: grpcclient.InferenceServerClient, models: list[str]) -> dict:
    out = {}
    for model in models:
        s = client.get_inference_statistics(model).model_stats[0]
        out[model] = {
            "inference_count": s.inference_count, "execution_count": s.execution_count,
            "success_count": s.inference_stats.success.count, "success_ns": s.inference_stats.success.ns,
            "queue_ns": s.inference_stats.queue.ns, "compute_input_ns": s.inference_stats.compute_input.ns,
            "compute_infer_ns": s.inference_stats.compute_infer.ns,
            "compute_output_ns": s.inference_stats.compute_output.ns,
        }
    return out


def server_breakdown(before: dict, after: dict) -> dict[str, dict]:
    """Per model: counts in the window and average microseconds per request of each phase."""
    out = {}
    for model in after:
        d = {k: after[model][k] - before[model][k] for k in after[model]}
        n = max(d["success_count"], 1)
        out[model] = {
            "inference_count": d["inference_count"], "execution_count": d["execution_count"],
            "requests": d["success_count"], "request_us": d["success_ns"] / n / 1e3,
            "queue_us": d["queue_ns"] / n / 1e3, "compute_input_us": d["compute_input_ns"] / n / 1e3,
            "compute_infer_us": d["compute_infer_ns"] / n / 1e3,
            "compute_output_us": d["compute_output_ns"] / n / 1e3,
            "compute_infer_total_us": d["compute_infer_ns"] / 1e3,
        }
    return out


def composing_models(client: grpcclient.InferenceServerClient, model: str) -> list[str]:
    config = client.get_model_config(model).config
    return [step.model_name for step in config.ensemble_scheduling.step]


async def _closed_loop(url: str, model: str, make_inputs: InputsFactory, concurrency: int,
                       warmup: float, window: float, outputs: list[str] | None) -> load.Run:
    client = grpcaio.InferenceServerClient(url)
    requested = [grpcclient.InferRequestedOutput(o) for o in outputs] if outputs else None

    async def request(call: load.Call) -> None:
        await client.infer(model, make_inputs(), outputs=requested)

    try:
        # str(error): Triton's own "[StatusCode...] message", as the report has always printed it
        return await load.run_async(request, concurrency, duration=window, warmup=warmup, describe_error=str)
    finally:
        await client.close()


def run_load(url: str, model: str, make_inputs: InputsFactory, concurrency: int, window: float = 10.0,
             warmup: float = 2.0, rows_per_request: int = 1, outputs: list[str] | None = None,
             stats_models: list[str] | None = None) -> LoadResult:
    """Closed loop: `concurrency` clients each send their next request as soon as the last returns.
    Server statistics are snapshotted around the whole run (warm-up included, as a close bound)."""
    sync = grpcclient.InferenceServerClient(url)
    models = stats_models or [model] + composing_models(sync, model)
    before = stats_snapshot(sync, models)
    run = asyncio.run(_closed_loop(url, model, make_inputs, concurrency, warmup, window, outputs))
    after = stats_snapshot(sync, models)
    return LoadResult.of(model, concurrency, run, rows_per_request, server_breakdown(before, after))


def format_report(result: LoadResult) -> str:
    us = 1e6
    lines = [f"Request concurrency: {result.concurrency}", "  Client:",
             f"    Request count: {len(result.latencies)}" + (f" (errors: {result.errors})" if result.errors else ""),
             f"    Throughput: {result.throughput:.1f} infer/sec"]
    if result.latencies:
        lines += [f"    Avg latency: {stats.mean(result.latencies) * us:.0f} usec "
                  f"(standard deviation {stats.stdev(result.latencies) * us:.0f} usec)"]
        lines += [f"    p{p} latency: {result.percentile(p) * us:.0f} usec" for p in (50, 90, 95, 99)]
    if result.first_error:
        lines.append(f"    First error: {result.first_error[:200]}")
    for i, (model, b) in enumerate(result.server.items()):
        if i == 0:
            lines.append("  Server:")
            indent = "    "
        else:
            lines += ["  Composing models:"] if i == 1 else []
            lines.append(f"    {model}:")
            indent = "      "
        lines += [f"{indent}Inference count: {b['inference_count']}",
                  f"{indent}Execution count: {b['execution_count']}",
                  f"{indent}Successful request count: {b['requests']}",
                  f"{indent}Avg request latency: {b['request_us']:.0f} usec (queue {b['queue_us']:.0f} usec + "
                  f"compute input {b['compute_input_us']:.0f} usec + compute infer {b['compute_infer_us']:.0f} "
                  f"usec + compute output {b['compute_output_us']:.0f} usec)"]
    return "\n".join(lines)


def in_process_limit(process_batch: Callable[[list], object], items: list, batch_sizes: tuple[int, ...],
                     seconds: float, unit: str, thread_counts: tuple[int, ...] | None = None
                     ) -> tuple[float, int, int]:
    """The limit a served pipeline is compared with: the same stage code called directly, items/s at
    the best batch size and torch thread count (1 and every core by default). -> (rate, batch, threads)"""
    import torch

    best = (0.0, 0, 0)
    for threads in thread_counts or tuple(sorted({1, os.cpu_count() or 1})):
        torch.set_num_threads(threads)
        for batch in batch_sizes:
            process_batch(items[:batch])  # warm-up
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                process_batch([items[(done + k) % len(items)] for k in range(batch)])
                done += batch
            rate = done / (time.perf_counter() - start)
            print(f"  limit, in-process, {threads} thread(s), batch {batch}: {rate:.1f} {unit}", flush=True)
            best = max(best, (rate, batch, threads))
    print(f"Limit: {best[0]:.1f} {unit} (in-process, batch {best[1]}, {best[2]} thread(s))\n", flush=True)
    return best


def best_limit(stage_code: Callable[[str, int], Callable[[list], object]], items: list,
               batch_sizes: tuple[int, ...], seconds: float, unit: str) -> float:
    """The limit over every path a stage can run: stage_code(runtime, threads) for ONNX Runtime and torch
    at 1 and 2 threads, each at its best batch size."""
    best = 0.0
    for runtime in ("onnx", "torch"):
        for threads in (1, 2):
            print(f"  in-process {runtime}, {threads} thread(s):", flush=True)
            rate, _, _ = in_process_limit(stage_code(runtime, threads), items, batch_sizes, seconds, unit,
                                          thread_counts=(threads,))
            best = max(best, rate)
    return best


def text_inputs_factory(texts: list[str], name: str = "text", rows: int = 1) -> InputsFactory:
    """Cycles through `texts` (str or bytes), `rows` per request, as a [rows, 1] TYPE_STRING tensor."""
    items = itertools.cycle(texts)

    def make():
        return [string_rows(name, [next(items) for _ in range(rows)])]

    return make


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("-u", "--url", default=os.environ.get("TRITON_GRPC_URL"),
                        help="default: the model's own server (codegen* on CODEGEN_GRPC_PORT, others on GRPC_PORT)")
    parser.add_argument("--concurrency", default="1,8,32", help="comma list or start:end:step")
    parser.add_argument("--window", type=float, default=10.0, help="measurement window, seconds")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--input-name", default="text")
    parser.add_argument("--text", action="append", help="string input (repeat for several); default: a sentence")
    parser.add_argument("--text-file", type=Path, help="one string input per line")
    parser.add_argument("--batch", type=int, default=1, help="rows per request")
    args = parser.parse_args()
    args.url = args.url or default_url(args.model)
    if ":" in args.concurrency:
        start, end, *step = (int(x) for x in args.concurrency.split(":"))
        levels = list(range(start, end + 1, step[0] if step else 1))
    else:
        levels = [int(x) for x in args.concurrency.split(",")]
    texts = args.text or (args.text_file.read_text().splitlines() if args.text_file else
                          ["Triton serves every stage of this pipeline inside the server."])
    print(f"*** Measurement Settings ***\n  Batch size: {args.batch}\n  Measurement window: "
          f"{args.window * 1000:.0f} msec\n  Using asynchronous calls for inference (closed loop)\n")
    summary = []
    for c in levels:
        result = run_load(args.url, args.model, text_inputs_factory(texts, args.input_name, args.batch), c,
                          args.window, args.warmup, args.batch)
        print(format_report(result) + "\n", flush=True)
        summary.append(f"Concurrency: {c}, throughput: {result.throughput:.1f} infer/sec, "
                       f"latency {result.percentile(50) * 1e6:.0f} usec (p50)")
    print("Inferences/Second vs. Client p50 Batch Latency\n" + "\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
