"""codegen: the seed's load test (output lengths 8/32/128/512 at concurrency 1 and 16) on the unary
`codegen` ensemble, time to first token on `codegen_stream`, and a mixed 8/256-token load; then
8 and 32 tokens again on a GPT-J of codegen-350M-mono-gptj's size (random weights, built once into
bench-results/), the model whose compute the seed's pre/post shares were measured against.

Goals checked (one run): tokens/s at concurrency 16 >= 4x concurrency 1; preprocessing +
postprocessing <= 2% of compute; 8-token p50 under a mixed 8/256 load <= 2x its idle p50.
The generator is decoupled and batches per decode step inside the model, so Triton's own counts
see one execution per enqueue; its decode steps, rows per step and compute time come from its
custom metrics (codegen_decode_steps, codegen_decode_rows, codegen_compute_duration_us, and
codegen_request_compute_duration_us, which counts each step once per sequence in it).

The pre/post share is printed two ways: the seed's metric (each stage's
nv_inference_compute_infer_duration_us over the generator's; Triton counts a batched execution once
for every request in it, and the generator's steps are counted the same way), and per execution
(pre + post busy time over pre + post + generator busy time, each execution counted once: their
share of the server's compute).
"""
from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import tritonclient.grpc as grpcclient

from bench import load, stats
from bench.perf import run_load
from client.generate import request_inputs
from launcher.processes import free_port
from launcher.triton_server import TritonServer

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["codegen_generator", "codegen", "codegen_stream"]
STAGES = ["codegen_preprocess", "codegen_collect", "codegen_postprocess", "codegen_generator"]
PRE_POST = ["codegen_preprocess", "codegen_postprocess"]
PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\n\ndef main(argv):\n",
           "class LRUCache:\n    def __init__(self, capacity):\n", "# parse a CSV file\nwith open(path) as f:\n"]
LENGTHS = (8, 32, 128, 512)
CUSTOM = ("codegen_decode_steps", "codegen_decode_rows", "codegen_compute_duration_us",
          "codegen_request_compute_duration_us")
SIZED = "350m"  # build/codegen.py DEMO_SIZES: codegen-350M-mono-gptj's architecture
SIZED_MODELS = ["codegen_preprocess", "codegen_generator", "codegen_collect", "codegen_postprocess", "codegen",
                "codegen_stream"]
SIZED_LENGTHS = (8, 32)  # the shortest outputs: where pre/post weigh most


def metrics_url(ctx) -> str:
    """The server's /metrics, from the running server's command line (8002 if it is not ours)."""
    host = ctx.grpc_url.rsplit(":", 1)[0]
    port = "8002"
    if ctx.server_pid is not None:
        args = psutil.Process(ctx.server_pid).cmdline()
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
        found = client.get_inference_statistics(model).model_stats[0]
        out[model] = sum(b.compute_infer.ns for b in found.batch_stats) / 1e3
    return out


def inputs_factory(max_tokens: int):
    prompts = itertools.cycle(PROMPTS)
    return lambda: request_inputs(next(prompts), max_tokens)


def window_for(ctx, max_tokens: int, concurrency: int, step_seconds: float) -> float:
    """Long enough for several whole requests (only requests inside the window count)."""
    per_request = step_seconds * max_tokens * (1 + concurrency / 8)  # rough, from one-row step time
    return max(ctx.window, (2 if ctx.quick else 3) * per_request)


def time_to_first_token(url: str, max_tokens: int, concurrency: int, prompts: list[str] = PROMPTS) -> list[float]:
    """`concurrency` streams started together (one request per client): seconds from send to the first piece of
    text, of each stream that sent one."""
    def one(call: load.Call) -> float | None:
        client = grpcclient.InferenceServerClient(url)
        got_first, done = threading.Event(), threading.Event()
        start, first = time.perf_counter(), []

        def callback(result, error):
            if error is not None:
                done.set()
                return
            response = result.get_response()
            if response.outputs and not got_first.is_set():
                got_first.set()
                first.append(time.perf_counter() - start)
            if response.parameters["triton_final_response"].bool_param:
                done.set()

        client.start_stream(callback=callback)
        client.async_stream_infer("codegen_stream", request_inputs(prompts[call.index % len(prompts)], max_tokens),
                                  enable_empty_final_response=True)
        done.wait(600)
        client.stop_stream()
        return first[0] if first else None

    run = load.run_threads(one, concurrency, count=concurrency)
    return [r.value for r in run.every if r.value is not None]


@contextlib.contextmanager
def busy_clients(url: str, clients: int, max_tokens: int):
    """`clients` threads sending unary `codegen` requests of `max_tokens` back to back while inside."""
    connections: dict[int, grpcclient.InferenceServerClient] = {}

    def request(call: load.Call) -> None:
        client = connections.get(call.worker) or connections.setdefault(call.worker,
                                                                        grpcclient.InferenceServerClient(url))
        client.infer("codegen", request_inputs(PROMPTS[call.worker % len(PROMPTS)], max_tokens))

    with load.Background(request, clients) as background:
        yield background


def mixed_load(url: str, seconds: float, long_clients: int = 8) -> list[float]:
    """8-token requests (one client) while `long_clients` clients keep 256-token requests running."""
    with busy_clients(url, long_clients, 256):
        time.sleep(2.0)  # the long generations are under way
        client = grpcclient.InferenceServerClient(url)
        run = load.run_threads(lambda call: client.infer("codegen", request_inputs(PROMPTS[0], 8)), 1, duration=seconds)
    return run.latencies


JOINING_PROMPT = 'def quicksort(items):\n    """Sort a list."""\n'  # 15 tokens (counted and printed)


def active_sequences(murl: str) -> float:
    with urllib.request.urlopen(murl, timeout=10) as response:
        lines = response.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith("codegen_generator_active_sequences{"))


def joining_ttft(url: str, murl: str, running: int = 15, samples: int = 8) -> tuple[list[float], list[float]]:
    """Time to first token of a 15-token prompt streamed alone (idle), then joining `running`
    sequences that keep decoding (clients sending 64-token requests back to back)."""
    time_to_first_token(url, 4, 1, [JOINING_PROMPT])  # the stream path's first call sets up lazily
    idle = [time_to_first_token(url, 4, 1, [JOINING_PROMPT])[0] for _ in range(samples)]
    joined = []
    with busy_clients(url, running, 64):
        deadline = time.monotonic() + 120
        while active_sequences(murl) < running and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(samples):
            joined += time_to_first_token(url, 4, 1, [JOINING_PROMPT])
    return idle, joined


def print_joining_goal(url: str, murl: str, repository: Path) -> None:
    from tokenizers import Tokenizer

    tokens = len(Tokenizer.from_file(str(repository / "codegen_generator" / "1" / "tokenizer.json"))
                 .encode(JOINING_PROMPT).ids)
    idle, joined = joining_ttft(url, murl)
    ratio = stats.median(joined) / stats.median(idle)
    print(f"goal TTFT of a {tokens}-token prompt joining 15 running sequences / idle <= 2: p50 "
          f"{stats.median(joined) * 1e3:.0f} ms vs {stats.median(idle) * 1e3:.0f} ms idle ({ratio:.2f}x) "
          f"{'OK' if ratio <= 2 else 'MISSED'}; samples (ms) joining {[round(t * 1e3) for t in joined]}, "
          f"idle {[round(t * 1e3) for t in idle]}", flush=True)


def measure(url: str, murl: str, ctx, max_tokens: int, concurrency: int, step_seconds: float) -> dict:
    """One closed-loop run on `codegen` and one burst of streams on `codegen_stream`; prints a row."""
    before, executed_before = generator_metrics(murl), execution_compute_us(url, PRE_POST)
    started = time.monotonic()
    result = run_load(url, "codegen", inputs_factory(max_tokens), concurrency,
                      window_for(ctx, max_tokens, concurrency, step_seconds), ctx.warmup,
                      stats_models=["codegen"] + STAGES)
    elapsed = time.monotonic() - started
    after, executed_after = generator_metrics(murl), execution_compute_us(url, PRE_POST)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in CUSTOM}
    server, lat = result.server, result.latencies
    pre, post = (executed_after[m] - executed_before[m] for m in PRE_POST)
    busy = pre + post + delta["codegen_compute_duration_us"]
    pre_rq, post_rq = (server[m]["compute_infer_total_us"] for m in PRE_POST)
    charged = delta["codegen_request_compute_duration_us"]  # the seed divides by the generator's compute
    row = dict(
        max_tokens=max_tokens, concurrency=concurrency, requests=len(lat), errors=result.errors,
        rps=result.throughput, tokens_per_s=result.throughput * max_tokens,
        mean_ms=stats.mean(lat) * 1e3, p95_ms=result.percentile(95) * 1e3,
        gen_inferences=server["codegen_generator"]["inference_count"],
        gen_executions=server["codegen_generator"]["execution_count"],
        steps=delta["codegen_decode_steps"],
        rows_per_step=delta["codegen_decode_rows"] / max(delta["codegen_decode_steps"], 1),
        pre_pct=100 * pre_rq / charged if charged else float("nan"),
        post_pct=100 * post_rq / charged if charged else float("nan"),
        executed_pct=100 * (pre + post) / busy if busy else float("nan"),
        engine_busy=delta["codegen_compute_duration_us"] / 1e6 / elapsed,
        per_request_us=[v / max(server[m]["requests"], 1) for v, m in
                        ((pre_rq, PRE_POST[0]), (post_rq, PRE_POST[1]), (charged, "codegen"))],
    )
    firsts = time_to_first_token(url, max_tokens, concurrency)
    row["ttft_ms"] = stats.median(firsts) * 1e3
    print(f"max_tokens {max_tokens:3d} concurrency {concurrency:2d}: {row['rps']:6.2f} req/s, "
          f"{row['tokens_per_s']:7.1f} tokens/s, latency mean {row['mean_ms']:7.0f} ms p95 "
          f"{row['p95_ms']:7.0f} ms, TTFT (streamed, p50) {row['ttft_ms']:5.0f} ms "
          f"[{row['requests']} requests{', %d errors' % row['errors'] if row['errors'] else ''}]", flush=True)
    print(f"    generator: nv_inference_count {row['gen_inferences']} vs nv_inference_exec_count "
          f"{row['gen_executions']}; {row['steps']:.0f} decode steps, {row['rows_per_step']:.1f} rows/step, "
          f"decode loop busy {100 * row['engine_busy']:.0f}% of the time", flush=True)
    pre_us, post_us, gen_us = row["per_request_us"]
    print(f"    compute vs the generator's, summed per request (the seed's metric): preprocess "
          f"{row['pre_pct']:.2f}% + postprocess {row['post_pct']:.2f}%; per execution (share of the "
          f"server's compute): {row['executed_pct']:.2f}% together. Per request: preprocess {pre_us:.0f} us, "
          f"postprocess {post_us:.0f} us, generator {gen_us / 1e3:.1f} ms", flush=True)
    return row


def load_test(url: str, murl: str, ctx, lengths, step_seconds: float) -> list[dict]:
    grpcclient.InferenceServerClient(url).infer("codegen", request_inputs(PROMPTS[0], 8))  # first calls set up lazily
    return [measure(url, murl, ctx, n, c, step_seconds) for n in lengths for c in (1, 16)]


def print_goals(rows: list[dict], label: str) -> None:
    for max_tokens in sorted({r["max_tokens"] for r in rows}):
        one, many = (next(r for r in rows if r["max_tokens"] == max_tokens and r["concurrency"] == c) for c in (1, 16))
        ratio = many["tokens_per_s"] / one["tokens_per_s"] if one["tokens_per_s"] else float("nan")
        print(f"goal tokens/s c16 >= 4x c1, {label}, max_tokens {max_tokens}: {ratio:.1f}x "
              f"{'OK' if ratio >= 4 else 'MISSED'}")
    worst = max(rows, key=lambda r: r["pre_pct"] + r["post_pct"])
    share = worst["pre_pct"] + worst["post_pct"]
    print(f"goal pre+post <= 2% of compute (the seed's metric), {label}: worst {share:.2f}% "
          f"(max_tokens {worst['max_tokens']}, concurrency {worst['concurrency']}) {'OK' if share <= 2 else 'MISSED'}; "
          f"per execution, worst {max(r['executed_pct'] for r in rows):.2f}%", flush=True)


def sized_repository(size: str) -> Path:
    """bench-results/codegen-<size>-repository: the codegen models' configs with the demo artifacts
    rebuilt at `size` (CODEGEN_DEMO_SIZE); rebuilt only when the builder or a config changes."""
    dest = ROOT / "bench-results" / f"codegen-{size}-repository"
    sources = [ROOT / "build" / "codegen.py", ROOT / "build" / "common.py"] + \
        [ROOT / "model_repository" / m / "config.pbtxt" for m in SIZED_MODELS]
    stamp = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()
    if (dest / ".stamp").exists() and (dest / ".stamp").read_text() == stamp:
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    for model in SIZED_MODELS:
        (dest / model / "1").mkdir(parents=True)
        shutil.copyfile(ROOT / "model_repository" / model / "config.pbtxt", dest / model / "config.pbtxt")
    print(f"bench: building the codegen models at size {size} into {dest}", flush=True)
    subprocess.run([sys.executable, str(ROOT / "build" / "build_models.py"), "--profile", "demo",
                    "--repository", str(dest), "codegen"], check=True,
                   env={**os.environ, "CODEGEN_DEMO_SIZE": size})
    (dest / ".stamp").write_text(stamp)
    return dest


def sized_load_test(ctx) -> list[dict]:
    repository = sized_repository(SIZED)
    server = TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          model_repository=repository, explicit_models=SIZED_MODELS,
                          log_file=ROOT / "bench-results" / f"tritonserver-codegen-{SIZED}.log")
    with server:
        print(f"bench: second tritonserver with the {SIZED} GPT-J ready (pid {server.process.pid})\n", flush=True)
        rows = load_test(server.grpc_url, server.metrics_url, ctx, SIZED_LENGTHS, step_seconds=0.12)
        print_joining_goal(server.grpc_url, server.metrics_url, repository)
        return rows


def decode_step_figures(repository: Path, rows: int = 16, cached: tuple[int, ...] = (128, 512, 1024),
                        steps: int = 7) -> None:
    """In-process, the sized generator's decode step (one token for each of `rows` sequences) over a
    cache already holding `cached` tokens, with the engine's in-place cache and with transformers'
    DynamicCache (torch.cat per step); median of `steps`. The cache is filled with random keys and
    values: a step's cost does not depend on their values."""
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    from gptj_generator.kv_cache import growing_cache

    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(str(repository / "codegen_generator" / "1")).eval()
    config = model.config
    shape = (rows, config.n_head, 0, config.n_embd // config.n_head)
    print(f"decode step in-process, {SIZED} GPT-J, {rows} rows, 2 threads (median of {steps}):", flush=True)
    with torch.inference_mode():
        for length in cached:
            caches = {"in-place": growing_cache(), "torch.cat": DynamicCache()}
            for cache in caches.values():
                for layer in range(config.n_layer):
                    cache.update(torch.randn(*shape[:2], length, shape[3]), torch.randn(*shape[:2], length, shape[3]), layer)
            token = torch.zeros(rows, 1, dtype=torch.long)
            samples: dict[str, list[float]] = {name: [] for name in caches}
            for step in range(steps + 1):  # the first is a warm-up; the two caches alternate (a noisy box)
                mask = torch.ones(rows, length + step + 1, dtype=torch.long)
                for name, cache in caches.items():
                    start = time.perf_counter()
                    hidden = model.transformer(input_ids=token, attention_mask=mask, past_key_values=cache,
                                               position_ids=torch.full((rows, 1), length + step),
                                               use_cache=True).last_hidden_state
                    model.lm_head(hidden[:, -1])
                    samples[name].append(time.perf_counter() - start)
            times = {name: stats.median(values[1:]) * 1e3 for name, values in samples.items()}
            del caches
            print(f"  {length} tokens cached: in-place {times['in-place']:.0f} ms, torch.cat {times['torch.cat']:.0f} ms "
                  f"({times['torch.cat'] / times['in-place']:.2f}x)", flush=True)


def run(ctx) -> None:
    print("-- demo GPT-J (3 layers, 128 wide): the model the tests use", flush=True)
    rows = load_test(ctx.grpc_url, metrics_url(ctx), ctx, (8, 128) if ctx.quick else LENGTHS, step_seconds=0.004)
    print()
    print_goals(rows, "demo GPT-J")
    idle = [r for r in rows if r["max_tokens"] == 8 and r["concurrency"] == 1][0]
    idle_p50 = stats.median(run_load(ctx.grpc_url, "codegen", inputs_factory(8), 1, 3.0, 0.5,
                                     stats_models=["codegen"]).latencies)
    short = mixed_load(ctx.grpc_url, 5.0 if ctx.quick else 10.0)
    mixed_p50 = stats.median(short)
    print(f"goal mixed 8/256 load: 8-token p50 {mixed_p50 * 1e3:.0f} ms vs idle {idle_p50 * 1e3:.0f} ms "
          f"({mixed_p50 / idle_p50:.1f}x, idle c1 run mean {idle['mean_ms']:.0f} ms) "
          f"{'OK' if mixed_p50 <= 2 * idle_p50 else 'MISSED'}")
    print(flush=True)
    if ctx.quick:
        print("-- GPT-J at codegen-350M-mono-gptj's size: skipped (--quick)\n", flush=True)
        return
    print("-- GPT-J at codegen-350M-mono-gptj's size (20 layers, 1024 wide, vocabulary 51200; random "
          "weights), same tokenizer stages", flush=True)
    sized = sized_load_test(ctx)
    print()
    print_goals(sized, f"{SIZED} GPT-J")
    print(flush=True)
    decode_step_figures(sized_repository(SIZED))  # after its server stopped: the cores are free
    print(flush=True)
