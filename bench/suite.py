"""`make bench`: every pipeline's served throughput and latency next to its in-process limit, and
the whole server's memory. Starts its own tritonserver on free ports unless --url is given.

Each pipeline has bench/bench_<pipeline>.py with `run(ctx)` and, if its models are not just
`[<pipeline>]`, a `MODELS` list of the models to load. The other bench_*.py are scripts of their own
(`python bench/bench_<name>.py`). OPT_IN entries run only when named:

    python -m bench.suite [--only text_embedding ner ...] [--quick]
    make bench BENCH_ARGS="--only codegen_engines"     (issue 42's engines side by side: one round)
    make bench BENCH_ARGS="--only perf_analyzer"       (Triton's perf_analyzer beside bench/perf.py, every ensemble)
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.perf import LoadResult, format_report
from launcher.processes import free_port
from launcher.triton_server import TritonServer
from supervisor.processes import process_tree

ROOT = Path(__file__).resolve().parent.parent

ORDER = ["text_embedding", "ner", "food_captioning", "codegen"]
# Run only when named with --only: what each costs is out of proportion to the rest of `make bench`
OPT_IN = {"codegen_engines": "three engines x in process and served x c=1, 4, 16 on the 350M shape, each in a fresh "
                             "process: ~12 min a round on a 2-core box, plus the 350M model and its IR built once"}


def suite_entries() -> list[str]:
    """The bench_<name>.py that define the suite's entry, `run(ctx)` (read, not imported: importing loads torch)."""
    found = {p.stem.removeprefix("bench_") for p in Path(__file__).parent.glob("bench_*.py")
             if re.search(r"^def run\(ctx\b", p.read_text(), re.MULTILINE)}
    return [n for n in ORDER if n in found] + sorted(found - set(ORDER))


def default_benches() -> list[str]:
    return [name for name in suite_entries() if name not in OPT_IN]


def memory_mib(pid: int) -> tuple[float, float, int]:
    """(RSS sum, PSS sum, process count) of the server and every stub it started."""
    rss = pss = 0
    pids = process_tree(pid)
    for p in pids:
        try:
            memory = psutil.Process(p).memory_full_info()  # smaps_rollup where the kernel has it
        except psutil.Error:
            continue
        rss, pss = rss + memory.rss, pss + memory.pss
    return rss / 2 ** 20, pss / 2 ** 20, len(pids)


@dataclass
class BenchContext:
    grpc_url: str
    server_pid: int | None
    window: float
    warmup: float
    quick: bool

    def report(self, result: LoadResult, limit: float | None = None, unit: str = "infer/sec") -> None:
        print(format_report(result))
        if limit:
            print(f"  Served/limit: {result.throughput:.1f} / {limit:.1f} {unit} = {result.throughput / limit:.2f}")
        print(flush=True)

    def print_memory(self, when: str) -> None:
        if self.server_pid is None:
            print(f"memory ({when}): not measured (server not started by this bench)\n")
            return
        rss, pss, count = memory_mib(self.server_pid)
        print(f"memory ({when}): tritonserver + {count - 1} stub processes: RSS {rss:.0f} MiB, "
              f"PSS {pss:.0f} MiB ({pss / 1024:.2f} GiB)\n", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", choices=suite_entries(),
                        help=f"entries to run (default: all but {', '.join(OPT_IN)})")
    parser.add_argument("--url", help="gRPC URL of a running server (default: start one here)")
    parser.add_argument("--window", type=float, default=float(os.environ.get("BENCH_WINDOW", 8)))
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true", help="fewer levels and short windows (smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.window, args.warmup = min(args.window, 2.0), 0.5
    names = args.only or default_benches()
    modules = {name: importlib.import_module(f"bench.bench_{name}") for name in names}
    server = None
    models = [m for name, module in modules.items() for m in getattr(module, "MODELS", [name])]
    if args.url is None and models:  # none: each entry named starts the servers it measures (codegen_engines)
        log = ROOT / "bench-results" / "tritonserver.log"
        log.parent.mkdir(exist_ok=True)
        server = TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                              explicit_models=models, log_file=log)
        print(f"bench: starting tritonserver with {', '.join(models)} (log: {log})", flush=True)
        t0 = time.monotonic()
        server.start(timeout=600)
        print(f"bench: server ready in {time.monotonic() - t0:.1f}s\n", flush=True)
    ctx = BenchContext(args.url or (server.grpc_url if server else ""), server.process.pid if server else None,
                       args.window, args.warmup, args.quick)
    try:
        ctx.print_memory("models loaded, before load")
        for name in names:
            print(f"==================== {name} ====================", flush=True)
            modules[name].run(ctx)
            ctx.print_memory(f"after {name}")
    finally:
        if server:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
