"""codegen's generator engines side by side (issue 42): the torch engine, OpenVINO fp32 and OpenVINO int8 weights,
each in process (the stage's engine alone, Triton-free) and served (`codegen_stream` over gRPC from a tritonserver
of the codegen models), at concurrency 1, 4 and 16, on a GPT-J of codegen-350M-mono's shape (random weights,
`CODEGEN_DEMO_SIZE=350m`, built once into bench-results/ by bench_codegen.sized_repository).

Workload: 16 prompts of code (10-19 tokens), 64 greedy tokens each; c clients send their requests back to back,
max(c, 2) requests in all (bench/load.py's closed loop, by count). OpenVINO infers in f32 (--param precision=auto
for the shipped default). Figures: generated tokens/s over the level's
wall time, time to first token (TTFT) p50, inter-token gap p50/p95 (a response's gap spread over the tokens it
carried; bench/stats.py's percentiles), the process's RSS (now and its peak: in process the kernel's high-water
mark, served the generator's stub sampled every 20 ms; psutil), and in process the longest wait of a thread that wakes every
millisecond (what one engine step holds the GIL for). Rounds are interleaved: every round runs each variant once,
each in a fresh process (in process: a child python; served: a fresh tritonserver). The load average is printed
with every row: this box is shared.

    python -m bench.bench_codegen_engines [--rounds 3] [--threads 1] [--variants ...] [--docs]
    make bench BENCH_ARGS="--only codegen_engines"   (one round; an opt-in entry of the suite: the default
                                                       `make bench` leaves it out, bench/suite.py OPT_IN)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench import load, stats

ROOT = Path(__file__).resolve().parent.parent

MODELS: list[str] = []  # `make bench` needs no model of the suite's server: this bench starts its own
VARIANTS = {"torch-fp32": ("torch", "fp32"), "openvino-fp32": ("openvino", "fp32"), "openvino-int8": ("openvino", "int8")}
LEVELS = (1, 4, 16)
NEW_TOKENS = 64
PROMPTS = ["def fibonacci(n):\n", "import os\nimport sys\n\n\ndef main(argv):\n",
           "class LRUCache:\n    def __init__(self, capacity):\n", "# parse a CSV file\nwith open(path) as f:\n",
           "def quicksort(items):\n    \"\"\"Sort a list.\"\"\"\n", "for key, value in sorted(table.items()):\n",
           "try:\n    import json\nexcept ImportError:\n", "def read_config(path, defaults=None):\n",
           "while queue:\n    node = queue.pop(0)\n", "if __name__ == '__main__':\n    parser = ",
           "async def fetch(session, url):\n", "class Point(NamedTuple):\n    x: float\n",
           "def test_addition():\n    assert add(", "lines = [line.rstrip() for line in",
           "@property\ndef name(self):\n", "with tempfile.TemporaryDirectory() as tmp:\n"]
RESULTS = ROOT / "bench-results" / "codegen-engines.json"
PLOT = ROOT / "docs" / "img" / "codegen-engines.png"
GENERATOR = "codegen_generator"
SERVED_MODELS = ["codegen_preprocess", GENERATOR, "codegen_stream"]


@dataclass
class Trace:
    """One request: when it was sent and (time, tokens so far) at each response."""
    sent: float
    marks: list[tuple[float, int]] = field(default_factory=list)


def summarize(traces: list[Trace], started: float, ended: float) -> dict:
    tokens = sum(t.marks[-1][1] for t in traces if t.marks)
    ttft = [t.marks[0][0] - t.sent for t in traces if t.marks]
    gaps = []
    for t in traces:
        for (t0, n0), (t1, n1) in zip(t.marks, t.marks[1:]):
            if n1 > n0:
                gaps += [(t1 - t0) / (n1 - n0)] * (n1 - n0)
    itl = stats.percentiles(gaps, (50, 95))
    return {"tokens": tokens, "tokens_per_s": tokens / (ended - started), "ttft_p50_ms": stats.median(ttft) * 1e3,
            "itl_p50_ms": itl[50] * 1e3, "itl_p95_ms": itl[95] * 1e3}


def closed_loop(send, concurrency: int) -> dict:
    """`concurrency` clients, max(concurrency, 2) requests in all, each client's back to back; send(prompt,
    trace) runs one request to its end, recording its marks."""
    def request(call: load.Call) -> Trace:
        trace = Trace(time.perf_counter())
        send(PROMPTS[call.index % len(PROMPTS)], trace)
        return trace

    run = load.run_threads(request, concurrency, count=max(concurrency, 2))
    return summarize([r.value for r in run.every if r.ok], run.started, run.ended)


def memory_mb(pid: int | None = None) -> dict:
    """RSS now and at its peak (this process: the kernel's high-water mark; another's: RssPeak's samples, else
    RSS now); file-backed pages apart (the mapped OpenVINO IR's, if not dropped; /dev/shm and memfd regions are
    shared memory, not files)."""
    process = psutil.Process(pid)
    rss = process.memory_info().rss / 2 ** 20
    file = sum(m.rss for m in process.memory_maps() if m.path.startswith("/")
               and not m.path.startswith(("/dev/shm/", "/memfd:"))) / 2 ** 20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 if pid is None else rss  # ru_maxrss: KiB
    return {"rss_mb": rss, "peak_mb": max(peak, rss), "file_mb": file}


class RssPeak:
    """The highest summed RSS of some processes, sampled every 20 ms while inside (psutil has no other process's
    high-water mark)."""

    def __init__(self, pids: list[int]):
        self.processes = [psutil.Process(p) for p in pids]
        self.mb, self._stop = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        total = 0
        for p in self.processes:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                continue
        self.mb = max(self.mb, total / 2 ** 20)

    def _run(self):
        while not self._stop.wait(0.02):
            self.sample()

    def __enter__(self):
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()


class Ticker:
    """A thread that wakes every millisecond: its longest gap is how long another thread held the GIL."""

    def __init__(self):
        self.longest, self._stop = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        last = time.perf_counter()
        while not self._stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            self.longest, last = max(self.longest, now - last), now

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# ---- repositories --------------------------------------------------------------------------------------------

def variant_repository(variant: str, threads: int, instances: int = 1, params: dict | None = None) -> Path:
    """bench-results/codegen-350m-<variant>-t<threads>: the codegen models' configs (the generator's engine,
    threads and instance count set) over the 350m artifacts, linked; for int8, the generator's version folder
    links the int8 IR (exported once into bench-results/) instead of the fp32 one."""
    from bench.bench_codegen import SIZED, SIZED_MODELS, sized_repository
    from build import openvino_export

    engine, weights = VARIANTS[variant]
    sized = sized_repository(SIZED)
    dest = variant_repository_path(variant, threads)
    if dest.exists():
        subprocess.run(["rm", "-rf", str(dest)], check=True)
    for model in SIZED_MODELS:
        (dest / model).mkdir(parents=True)
        config = (sized / model / "config.pbtxt").read_text()
        if model == GENERATOR:
            config = config.replace('{ key: "engine" value: { string_value: "auto" } }',
                                    f'{{ key: "engine" value: {{ string_value: "{engine}" }} }}')
            # f32 inference unless --param says otherwise: the variants compare weights and engines (issue 42), not
            # the shipped precision auto (bf16 where the CPU has it: bench/codegen_limits.py serves it as shipped)
            for key, value in {"openvino_threads": threads, "torch_threads": threads, "precision": "f32",
                               **(params or {})}.items():
                config, found = re.subn(rf'(key: "{key}",? value: {{ string_value: )"[^"]*"', rf'\g<1>"{value}"', config)
                assert found == 1, f"the generator's config has no parameter {key}"
            assert f'string_value: "{engine}"' in config, "the generator's config no longer ships engine: auto"
            config = config.replace("instance_group [{ kind: KIND_AUTO count: 1 }]",
                                    f"instance_group [{{ kind: KIND_AUTO count: {instances} }}]")
        (dest / model / "config.pbtxt").write_text(config)
        if model == GENERATOR and weights != "fp32":
            version = dest / model / "1"
            version.mkdir()
            for item in (sized / model / "1").iterdir():
                if item.name != openvino_export.IR_FOLDER:
                    (version / item.name).symlink_to(item)
            ir = ROOT / "bench-results" / f"codegen-{SIZED}-openvino-{weights}"
            if not (ir / "openvino_model.xml").exists():
                openvino_export.export(sized / model / "1", ir, weights)
            (version / openvino_export.IR_FOLDER).symlink_to(ir, target_is_directory=True)
        else:
            (dest / model / "1").symlink_to(sized / model / "1", target_is_directory=True)
    return dest


# ---- in process (a child python per variant and round) ----------------------------------------------------------

class TraceSink:
    def __init__(self, trace: Trace):
        self.trace, self.count, self.done = trace, 0, threading.Event()

    def send(self, token_ids, logprobs=None):
        self.count += len(token_ids)
        self.trace.marks.append((time.perf_counter(), self.count))

    def finish(self, reason, token_ids, logprobs=None):
        if token_ids:
            self.send(token_ids)
        self.done.set()

    def fail(self, error):
        self.done.set()

    def cancelled(self):
        return False


def in_process_child(variant: str, threads: int, levels: list[int], keep_mapped: bool = False) -> dict:
    from google.protobuf import json_format, text_format
    from tokenizers import Tokenizer
    from tritonclient.grpc import model_config_pb2

    from gptj_generator.loading import engine_options, load_engine
    from gptj_generator.seam import GenerationRequest

    engine_kind, _ = VARIANTS[variant]
    folder = variant_repository_path(variant, threads) / GENERATOR
    config = text_format.Parse((folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    options = engine_options(json_format.MessageToDict(config, preserving_proto_field_name=True))  # as served
    version = folder / "1"
    if engine_kind == "torch":
        import torch

        torch.set_num_threads(threads)
    if keep_mapped:  # what RSS would be without dropping the mapped weights' pages (the second copy)
        import gptj_generator.openvino_engine

        gptj_generator.openvino_engine.drop_file_pages = lambda path: 0
    engine = load_engine(engine_kind, version, **options, threads=threads)
    tokenizer = Tokenizer.from_file(str(version / "tokenizer.json"))
    ids = {p: tokenizer.encode(p).ids for p in PROMPTS}

    def send(prompt: str, trace: Trace) -> None:
        sink = TraceSink(trace)
        engine.submit(GenerationRequest(ids[prompt], NEW_TOKENS), sink)
        sink.done.wait(1800)

    send(PROMPTS[0], Trace(time.perf_counter()))  # warm-up
    out = {"loaded": memory_mb(), "levels": {}}
    for level in levels:
        with Ticker() as ticker:
            row = closed_loop(send, level)
        row["gil_wait_max_ms"] = ticker.longest * 1e3
        out["levels"][str(level)] = row
    out["after"] = memory_mb()
    engine.close()
    return out


def variant_repository_path(variant: str, threads: int) -> Path:
    from bench.bench_codegen import SIZED

    return ROOT / "bench-results" / f"codegen-{SIZED}-{variant}-t{threads}"


def in_process(variant: str, threads: int, levels: list[int], keep_mapped: bool = False) -> dict:
    done = subprocess.run([sys.executable, "-m", "bench.bench_codegen_engines", "--child", variant, "--threads", str(threads),
                           "--levels", *map(str, levels), *(["--keep-mapped-weights"] if keep_mapped else [])],
                          capture_output=True, text=True, timeout=3600, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"in-process {variant} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- served (a fresh tritonserver per variant and round) -------------------------------------------------------

def stream_send(url: str):
    import tritonclient.grpc as grpcclient

    from client.generate import request_inputs

    def send(prompt: str, trace: Trace) -> None:
        client = grpcclient.InferenceServerClient(url)
        done = threading.Event()

        def callback(result, error):
            if error is not None:
                done.set()
                return
            response = result.get_response()
            if response.outputs:
                trace.marks.append((time.perf_counter(), int(result.as_numpy("completion_tokens").reshape(-1)[0])))
            if response.parameters["triton_final_response"].bool_param:
                done.set()

        client.start_stream(callback=callback)
        client.async_stream_infer("codegen_stream", request_inputs(prompt, NEW_TOKENS), enable_empty_final_response=True)
        done.wait(1800)
        client.stop_stream()
        client.close()

    return send


def served(variant: str, threads: int, levels: list[int]) -> dict:
    from launcher.processes import free_port
    from launcher.triton_server import TritonServer
    from supervisor.stubs import of_model, scan_stub_pids

    repository = variant_repository_path(variant, threads)
    log = ROOT / "bench-results" / f"tritonserver-codegen-engines-{variant}.log"
    server = TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          model_repository=repository, explicit_models=SERVED_MODELS, log_file=log)
    with server:
        send = stream_send(server.grpc_url)
        send(PROMPTS[0], Trace(time.perf_counter()))  # warm-up: the stream path's first call sets up lazily
        stubs = list(of_model(scan_stub_pids(server.process.pid), GENERATOR))
        out = {"loaded": sum_memory(stubs), "levels": {}}
        with RssPeak(stubs) as peak:
            for level in levels:
                out["levels"][str(level)] = closed_loop(send, level)
        out["after"] = {**sum_memory(stubs), "peak_mb": peak.mb}
    return out


def sum_memory(pids: list[int]) -> dict:
    found = [memory_mb(pid) for pid in pids]
    return {key: sum(m[key] for m in found) for key in ("rss_mb", "peak_mb", "file_mb")}


# ---- rounds, report, plot ------------------------------------------------------------------------------------------

def load_average() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def run_rounds(variants: list[str], rounds: int, threads: int, levels: list[int], modes: list[str],
               instances: int = 1, params: dict | None = None) -> list[dict]:
    for variant in variants:
        variant_repository(variant, threads, instances, params)
    rows = []
    for r in range(rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]  # who goes first rotates
        for variant in order:
            for mode in modes:
                before = load_average()
                result = in_process(variant, threads, levels) if mode == "in-process" else served(variant, threads, levels)
                row = {"round": r + 1, "variant": variant, "mode": mode, "threads": threads, "instances": instances,
                       "params": params or {},
                       "load_before": before, "load_after": load_average(), **result}
                rows.append(row)
                print_row(row)
    return rows


def print_row(row: dict) -> None:
    print(f"round {row['round']} {row['mode']:10s} {row['variant']:14s} (load {row['load_before']} -> "
          f"{row['load_after']}): RSS loaded {row['loaded']['rss_mb']:.0f} MB, after {row['after']['rss_mb']:.0f} MB "
          f"({row['after'].get('file_mb', float('nan')):.0f} MB file-backed), peak {row['after']['peak_mb']:.0f} MB",
          flush=True)
    for level, m in row["levels"].items():
        gil = f", longest 1 ms-ticker wait {m['gil_wait_max_ms']:.0f} ms" if "gil_wait_max_ms" in m else ""
        print(f"    c={level:>2}: {m['tokens_per_s']:7.1f} tokens/s, TTFT p50 {m['ttft_p50_ms']:7.0f} ms, "
              f"inter-token p50/p95 {m['itl_p50_ms']:6.1f} / {m['itl_p95_ms']:6.1f} ms{gil}", flush=True)


def median_of(rows: list[dict], variant: str, mode: str, level: int, key: str) -> float:
    return stats.median(r["levels"][str(level)][key] for r in rows if r["variant"] == variant and r["mode"] == mode
                        and str(level) in r["levels"])


def verdict(value: float, met: bool) -> str:
    return "not measured in this run" if value != value else ("met" if met else "MISSED")


def goals(rows: list[dict]) -> list[str]:
    """Issue 42's goals, from each round's paired figures (the median over rounds)."""
    lines = []

    def ratio(a: str, b: str, mode_a: str, mode_b: str, level: int, key="tokens_per_s") -> float:
        per_round = []
        for r in sorted({row["round"] for row in rows}):
            x = [row for row in rows if row["round"] == r and row["variant"] == a and row["mode"] == mode_a]
            y = [row for row in rows if row["round"] == r and row["variant"] == b and row["mode"] == mode_b]
            if x and y and str(level) in x[0]["levels"] and str(level) in y[0]["levels"]:
                per_round.append(x[0]["levels"][str(level)][key] / y[0]["levels"][str(level)][key])
        return stats.median(per_round)

    for variant, c16, c1 in (("openvino-fp32", 2.2, 1.5), ("openvino-int8", 2.8, 3.5)):
        for level, goal in ((16, c16), (1, c1)):
            value = ratio(variant, "torch-fp32", "served", "served", level)
            lines.append(f"served {variant} / torch tokens/s at c={level}: {value:.2f}x (goal >= {goal}x) "
                         f"{verdict(value, value >= goal)}")
    for variant in VARIANTS:
        value = ratio(variant, variant, "served", "in-process", 16)
        lines.append(f"served / in-process, {variant}, c=16: {value:.2f} (goal >= 0.9) {verdict(value, value >= 0.9)}")
    for variant in ("openvino-fp32", "openvino-int8"):
        value = ratio(variant, "torch-fp32", "served", "served", 16, "ttft_p50_ms")
        lines.append(f"TTFT p50 at c=16, served {variant} / torch: {value:.2f} (goal <= 1) {verdict(value, value <= 1)}")
    for key, label in (("after", "after the run"), ("peak", "peak (sampled every 20 ms)")):
        field_name = "peak_mb" if key == "peak" else "rss_mb"

        def served_rss(variant: str) -> float:
            return stats.median(r["after"][field_name] for r in rows if r["variant"] == variant
                                and r["mode"] == "served")

        for variant, goal in (("openvino-fp32", 1.6), ("openvino-int8", 0.6)):
            share = served_rss(variant) / served_rss("torch-fp32")
            lines.append(f"generator stub RSS {label}, {variant} / torch: {served_rss(variant):.0f} / "
                         f"{served_rss('torch-fp32'):.0f} MB = {share:.2f} (goal <= {goal}) {verdict(share, share <= goal)}")
    return lines


def table(rows: list[dict], levels: list[int]) -> str:
    out = ["| engine | mode | " + " | ".join(f"c={c} tokens/s" for c in levels) + " | TTFT p50 c=1 / c=16 (ms) | "
           "inter-token p50 / p95 c=16 (ms) | RSS after / peak (MB) |", "|" + "---|" * (len(levels) + 5)]
    for variant in VARIANTS:
        for mode in ("in-process", "served"):
            mine = [r for r in rows if r["variant"] == variant and r["mode"] == mode]
            if not mine:
                continue
            speeds = " | ".join(f"{median_of(rows, variant, mode, c, 'tokens_per_s'):.1f}" for c in levels)
            rss = stats.median(r["after"]["rss_mb"] for r in mine)
            peak = stats.median(r["after"]["peak_mb"] for r in mine)
            out.append(f"| {variant} | {mode} | {speeds} | {median_of(rows, variant, mode, 1, 'ttft_p50_ms'):.0f} / "
                       f"{median_of(rows, variant, mode, 16, 'ttft_p50_ms'):.0f} | "
                       f"{median_of(rows, variant, mode, 16, 'itl_p50_ms'):.1f} / "
                       f"{median_of(rows, variant, mode, 16, 'itl_p95_ms'):.1f} | {rss:.0f} / {peak:.0f} |")
    return "\n".join(out)


def plot(rows: list[dict], levels: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, mode in zip(axes, ("in-process", "served")):
        for variant in VARIANTS:
            values = [median_of(rows, variant, mode, c, "tokens_per_s") for c in levels]
            ax.plot(levels, values, marker="o", label=variant)
        ax.set_title(f"{mode}: 350M-shape GPT-J, 64 tokens")
        ax.set_xlabel("concurrency")
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("generated tokens/s (median of rounds)")
    axes[1].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def report(rows: list[dict], levels: list[int], docs: bool) -> None:
    print("\nmedians over rounds:\n" + table(rows, levels))
    print("\ngoals (per-round ratios, median):")
    for line in goals(rows):
        print("  " + line)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=1))
    print(f"\nresults: {RESULTS}", flush=True)
    if docs:
        plot(rows, levels, PLOT)
        print(f"plot: {PLOT}", flush=True)


def run(ctx) -> None:
    """`make bench`'s entry: one round (the --quick suite: c=1 and 16 only)."""
    levels = [1, 16] if ctx.quick else list(LEVELS)
    rows = run_rounds(list(VARIANTS), 1, 1, levels, ["in-process", "served"])
    report(rows, levels, docs=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="inference threads per engine (both modes)")
    parser.add_argument("--instances", type=int, default=1, help="generator instances (served)")
    parser.add_argument("--param", nargs="*", default=[], metavar="KEY=VALUE",
                        help="generator config parameters to change, e.g. prefill_chunk_tokens=256")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--levels", nargs="*", type=int, default=list(LEVELS))
    parser.add_argument("--modes", nargs="*", default=["in-process", "served"], choices=["in-process", "served"])
    parser.add_argument("--docs", action="store_true", help=f"also write the plot to {PLOT.relative_to(ROOT)}")
    parser.add_argument("--keep-mapped-weights", action="store_true",
                        help="in process only, OpenVINO: do not drop the mapped IR's pages (RSS without the fix)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the in-process run of one variant
    args = parser.parse_args()
    if args.child:
        print(json.dumps(in_process_child(args.child, args.threads, args.levels, args.keep_mapped_weights)))
        return 0
    if args.keep_mapped_weights:
        variant_repository(args.variants[0], args.threads)
        row = {"round": 1, "variant": args.variants[0] + " (mapped pages kept)", "mode": "in-process",
               "load_before": load_average(), **in_process(args.variants[0], args.threads, args.levels, True),
               "load_after": load_average()}
        print_row(row)
        return 0
    print(f"codegen engines: {args.rounds} round(s), {args.threads} thread(s), {args.instances} instance(s), "
          f"parameters {args.param or 'as shipped'}, levels {args.levels}, load average {load_average()}", flush=True)
    params = dict(item.split("=", 1) for item in args.param)
    rows = run_rounds(args.variants, args.rounds, args.threads, args.levels, args.modes, args.instances, params)
    report(rows, args.levels, args.docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
