"""What API keys and quotas cost (issue 25): POST /v1/embeddings, one sentence per request, at
concurrency 1 and 32, against two gateways in front of the same Triton in the same run: one open (no
keys, loopback) and one with keys (auth, per-key quotas, audit, body caps all on). Runs alternate
open/keyed in rounds so that drift on a shared box hits both; then, per round, one interleaved load sends
each client's requests to the two gateways in turn, so that both share every moment of the drift (the
figure that resolves c1's small differences). Also the CPU time of the middleware stack alone, in process
(no network, no Triton), with the loop let run between requests so that work a request leaves behind (a
limiter's sweep) is timed too.
Goal: keyed >= 97% of open throughput and p50 within 0.3 ms. The last column gives each paired difference's
mean over the rounds with its 95% interval: a goal narrower than that interval is one the run cannot decide.

    .venv/bin/python -m bench.bench_security [--window 8] [--rounds 2]
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import tempfile
import time
from pathlib import Path

from bench import stats
from bench.bench_gateway import CpuShare
from bench.bench_text_embedding import corpus
from bench.http_load import bearer, run_http_load, run_http_load_interleaved
from bench.paired import interval
from launcher.gateway_process import GatewayProcess
from launcher.processes import free_port
from launcher.triton_server import TritonServer

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
KEY = "gk-bench-key-0123456789"


def middleware_cost(calls: int = 20000) -> dict[str, float]:
    """Microseconds per request of the keyed app's middleware stack vs the open app's, around a route
    that answers at once (the ASGI app called directly)."""
    with tempfile.TemporaryDirectory(prefix="bench-security-") as tmp:
        return _middleware_cost(Path(tmp), calls)


def _middleware_cost(tmp: Path, calls: int) -> dict[str, float]:
    from types import SimpleNamespace

    from gateway.app import create_app
    from gateway.keys import key_line
    from gateway.settings import Settings

    (tmp / "keys").write_text(key_line(KEY, "bench", "inference", rps=1_000_000))
    apps = {"open": create_app(Settings(data_dir=tmp)), "keyed": create_app(Settings(data_dir=tmp, api_keys_file=tmp / "keys"))}
    for app in apps.values():  # GET /v1/models with no model loaded: a route that answers at once
        app.state.models = SimpleNamespace(loaded=lambda: [])

    async def run(app, headers) -> float:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                 "scheme": "http", "path": "/v1/models", "raw_path": b"/v1/models", "query_string": b"",
                 "root_path": "", "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
                 "state": {}}

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            pass

        for _ in range(500):
            await app(dict(scope), receive, send)
        started = time.perf_counter()
        for _ in range(calls):
            await app(dict(scope, headers=list(headers)), receive, send)
            # let the loop run what the request left behind (a rate limiter's sweep task, say), as it would
            # between requests in a server: without it that work is never timed
            await asyncio.sleep(0)
        return (time.perf_counter() - started) / calls * 1e6

    async def rounds() -> dict[str, float]:  # one event loop, as in the server: the limiter's locks belong to it
        out = {name: float("inf") for name in apps}
        for _ in range(5):  # interleaved, best of five: the box's noise is one-sided
            for name, app in apps.items():
                headers = [(b"authorization", f"Bearer {KEY}".encode())] if name == "keyed" else []
                out[name] = min(out[name], await run(app, headers))
        return out
    return asyncio.run(rounds())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calls", type=int, default=20000, help="in-process middleware calls per timing (0: skip)")
    parser.add_argument("--log-dir", type=Path, help="keep the gateways' and Triton's logs here")
    args = parser.parse_args()

    if args.calls:
        cost = middleware_cost(args.calls)
        print(f"middleware stack in process: open {cost['open']:.1f} us/request, keyed {cost['keyed']:.1f} us/request "
              f"(+{cost['keyed'] - cost['open']:.1f} us)", flush=True)

    texts = itertools.cycle(corpus(512))

    def body():
        return {"model": MODEL, "input": next(texts)}

    with tempfile.TemporaryDirectory(prefix="bench-security-") as tmp:
        tmp = Path(tmp)
        logs = args.log_dir or tmp
        logs.mkdir(parents=True, exist_ok=True)
        keys = tmp / "keys"
        from gateway.keys import key_line

        # the quota is exercised on every request (hit + window stats) but set above what c32 reaches
        keys.write_text(key_line(KEY, "bench", "inference", rps=100_000, concurrency=256))
        with TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          explicit_models=["text_embedding"], log_file=logs / "tritonserver.log",
                          extra_repositories=[tmp / "data" / "triton_models"]) as server:
            gateways = {
                "open": GatewayProcess(server.grpc_url, port=free_port(), data_dir=tmp / "open",
                                       log_file=logs / "open.log"),
                "keyed": GatewayProcess(server.grpc_url, port=free_port(), data_dir=tmp / "keyed",
                                        log_file=logs / "keyed.log", env={"GATEWAY_API_KEYS_FILE": str(keys)}),
            }
            try:
                for gateway in gateways.values():
                    gateway.start(timeout=180)
                results: dict[tuple[str, int], list] = {}
                interleaved: dict[tuple[str, int], list] = {}
                for _round in range(args.rounds):
                    for concurrency in (1, 32):
                        for name, gateway in gateways.items():
                            cpu = CpuShare([gateway.process.pid])
                            result = run_http_load(f"{gateway.url}/v1/embeddings", body, concurrency, args.window,
                                                   args.warmup, label=name, api_key=KEY if name == "keyed" else None)
                            # the gateway's CPU per request (warm-up included at the window's rate): the figure
                            # that drifts least here, and what a key costs the 2 cores Triton shares
                            result.gateway_cpu_ms = cpu.share() * 1000 / max(result.throughput, 1e-9)
                            results.setdefault((name, concurrency), []).append(result)
                            report(f"round {_round + 1} c{concurrency} {name:5}", result)
                        # the same two gateways, every client sending to each in turn: both share every moment
                        cpus = {name: CpuShare([g.process.pid]) for name, g in gateways.items()}
                        pair = run_http_load_interleaved(
                            {name: (f"{g.url}/v1/embeddings", bearer(KEY) if name == "keyed" else {})
                             for name, g in gateways.items()}, body, concurrency, args.window, args.warmup)
                        for name, result in pair.items():
                            result.gateway_cpu_ms = cpus[name].share() * 1000 / max(result.throughput, 1e-9)
                            interleaved.setdefault((name, concurrency), []).append(result)
                            report(f"round {_round + 1} c{concurrency} {name:5} interleaved", result)
                for name, gateway in gateways.items():  # errors: show why, before the logs go with tmp
                    if any(r.errors for r in results[(name, 1)] + results[(name, 32)]):
                        lines = gateway.log_file.read_text(errors="replace").splitlines()
                        start = next((i for i, line in enumerate(lines) if "internal error" in line), max(0, len(lines) - 30))
                        print(f"--- {name} gateway log from its first internal error:\n" + "\n".join(lines[start:start + 40]))
                        tail = (logs / "tritonserver.log").read_text(errors="replace").splitlines()[-15:]
                        print("--- tritonserver log tail:\n" + "\n".join(tail))
            finally:
                for gateway in gateways.values():
                    gateway.stop()
            for name, gateway in gateways.items():  # warm-up requests too: every internal error counts
                text = gateway.log_file.read_text(errors="replace") if gateway.log_file.exists() else ""
                print(f"{name} gateway log: {text.count('internal error')} internal errors, "
                      f"{text.count('Exception in ASGI application')} unhandled exceptions")

    print("""
Alternating runs: throughput and the gateway's CPU, run by run (what the whole box gives each gateway).""")
    table(results)
    print("""
Interleaved: one load, every client sending to the open and the keyed gateway in turn, so each request's
latency compares with its neighbour's under the same drift. req/s is concurrency / mean latency (what a
closed loop on that gateway alone would give at the same latencies), so keyed/open is the ratio of means.
Both gateways share the extra CPU a key costs the box, so at c32 this p50 is the request path's own cost;
the alternating table's throughput is the box's.""")
    table(interleaved, from_latency=True)
    return 0


def mean_latency(result) -> float:
    """nan for a run whose every request failed: the report goes on to its errors instead of stopping."""
    return stats.mean(result.latencies) if result.latencies else float("nan")


def report(label: str, result) -> None:
    print(f"  {label}: {result.throughput:7.1f} req/s, p50 {result.percentile(50) * 1000:6.2f} ms, mean "
          f"{mean_latency(result) * 1000:6.2f} ms, gateway CPU {result.gateway_cpu_ms:.3f} ms/req, "
          f"errors {result.errors}" + (f" ({result.first_error})" if result.errors else ""), flush=True)


def table(results, from_latency: bool = False) -> None:
    """`from_latency`: req/s as concurrency / mean latency (the interleaved load sends each target the same
    number of requests, so its counts say nothing)."""
    def rate(result) -> float:
        return result.concurrency / mean_latency(result) if from_latency else result.throughput

    print("| concurrency | open req/s | keyed req/s | keyed/open | open p50 ms | keyed p50 ms | p50 delta ms "
          "| gateway CPU ms/req open, keyed (delta) | keyed/open, p50 delta per round "
          "| rounds' mean, 95% interval: keyed/open, p50 delta ms, CPU delta us |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for concurrency in (1, 32):
        rows = {}
        for name in ("open", "keyed"):
            runs = results[(name, concurrency)]
            rows[name] = (stats.mean(rate(r) for r in runs),
                          stats.median(r.percentile(50) for r in runs) * 1000,
                          stats.mean(r.gateway_cpu_ms for r in runs))
        (ot, op, oc), (kt, kp, kc) = rows["open"], rows["keyed"]
        pairs = list(zip(results[("open", concurrency)], results[("keyed", concurrency)]))
        rounds = ", ".join(f"{rate(k) / rate(o):.3f} {(k.percentile(50) - o.percentile(50)) * 1000:+.2f}"
                           for o, k in pairs)
        ratio = interval([rate(k) / rate(o) for o, k in pairs])
        p50 = interval([(k.percentile(50) - o.percentile(50)) * 1000 for o, k in pairs])
        cpu = interval([(k.gateway_cpu_ms - o.gateway_cpu_ms) * 1000 for o, k in pairs])
        print(f"| {concurrency} | {ot:.1f} | {kt:.1f} | {kt / ot:.3f} | {op:.2f} | {kp:.2f} | {kp - op:+.2f} "
              f"| {oc:.3f}, {kc:.3f} ({(kc - oc) * 1000:+.0f} us) | {rounds} "
              f"| {ratio[0]:.3f} ± {ratio[1]:.3f}, {p50[0]:+.2f} ± {p50[1]:.2f}, {cpu[0]:+.0f} ± {cpu[1]:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
