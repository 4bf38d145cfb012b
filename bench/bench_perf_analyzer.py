"""Triton's own perf_analyzer on every ensemble (gRPC, concurrency 1 and 8, --streaming for the decoupled
codegen_stream) beside the project's load generator (bench/perf.py; for codegen_stream the gRPC streaming loop
of bench/bench_completions.py) on the same models, the same inputs and the same server, one after the other.

    python -m bench.suite --only perf_analyzer [--url HOST:GRPC_PORT] [--window 8]
    make bench BENCH_ARGS="--only perf_analyzer"

perf_analyzer comes from the tritonclient 2.51 wheel, in a venv of its own (.perf-tools, made on first use by
tools/perf_tools_venv.sh): the project's .venv keeps its newer tritonclient, whose wheels no longer carry the
binary. Its --input-data files are written here from the same texts, photos and prompts bench/perf.py sends.
"""
from __future__ import annotations

import asyncio
import base64
import csv
import itertools
import json
import os
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench import bench_completions
from bench.bench_food_captioning import photos
from bench.bench_ner import corpus as ner_corpus
from bench.bench_text_embedding import corpus as embedding_corpus
from bench.perf import run_load, text_inputs_factory
from client.generate import request_inputs

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".perf-tools"
MODELS = ["text_embedding", "ner", "food_captioning", "codegen_generator", "codegen", "codegen_stream"]
CONCURRENCY = (1, 8)
MAX_TOKENS = 16  # codegen's completions: short, so a window holds many of them on a CPU
PROMPTS = bench_completions.PROMPTS


@dataclass
class Ensemble:
    model: str
    data: list[dict]  # perf_analyzer's --input-data entries (one request each, cycled)
    streaming: bool = False


def perf_analyzer_env() -> dict[str, str]:
    """The binary's two shared libraries that the wheel does not bring (tools/perf_tools_venv.sh)."""
    cudart = next(VENV.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"))
    paths = [str(VENV / "native"), str(cudart), os.environ.get("LD_LIBRARY_PATH", "")]
    return {**os.environ, "LD_LIBRARY_PATH": ":".join(p for p in paths if p)}


def ensure_perf_analyzer() -> Path | None:
    """The binary, its venv made first if need be; None (and why, printed) where it cannot be made (offline)."""
    made = subprocess.run(["bash", str(ROOT / "tools" / "perf_tools_venv.sh")], capture_output=True, text=True)
    if made.returncode != 0:
        print(f"perf_analyzer: not run, tools/perf_tools_venv.sh failed: {made.stderr.strip()[-500:]}", flush=True)
        return None
    return VENV / "bin" / "perf_analyzer"


def bytes_b64(item: bytes) -> dict:
    """A one-element BYTES tensor as perf_analyzer takes binary data: base64 of Triton's serialized form
    (4-byte little-endian length, then the bytes); JSON strings cannot hold a JPEG."""
    return {"b64": base64.b64encode(struct.pack("<I", len(item)) + item).decode("ascii")}


def codegen_tensors(prompt: str) -> dict:
    """The tensors bench/bench_completions.py's gRPC loop sends (gateway/completions/tensors.py, greedy)."""
    return {"text_input": [prompt], "max_tokens": [MAX_TOKENS], "temperature": [0.0], "top_k": [0], "top_p": [1.0],
            "random_seed": [0]}


def ensembles(texts: list[str], sentences: list[str], images: list[bytes]) -> list[Ensemble]:
    return [Ensemble("text_embedding", [{"text": [t]} for t in texts]),
            Ensemble("ner", [{"text": [t]} for t in sentences]),
            Ensemble("food_captioning", [{"image": bytes_b64(i)} for i in images]),
            Ensemble("codegen", [codegen_tensors(p) for p in PROMPTS]),
            Ensemble("codegen_stream", [codegen_tensors(p) for p in PROMPTS], streaming=True)]


def perf_analyzer(binary: Path, url: str, ensemble: Ensemble, concurrency: int, window: float,
                  work: Path) -> dict[str, str]:
    """One perf_analyzer run at one concurrency -> its CSV row (throughput, latency percentiles in usec)."""
    data = work / f"{ensemble.model}.json"
    data.write_text(json.dumps({"data": ensemble.data}))
    out = work / f"{ensemble.model}_c{concurrency}.csv"
    # stability 100%: three windows within 2x of each other. At perf_analyzer's 10% (or 50%) a shared 2-core box
    # often never settles: ner at c1 failed "Failed to obtain stable measurement" in 6 windows at 50% (2026-12-02)
    command = [str(binary), "-m", ensemble.model, "-u", url, "-i", "grpc", "--input-data", str(data),
               "--concurrency-range", str(concurrency), "--measurement-interval", str(int(window * 1000)),
               "--stability-percentage", "100", "--max-trials", "10", "-f", str(out)]
    if ensemble.streaming:
        command.append("--streaming")
    shown = [os.path.relpath(command[0], ROOT)] + [c.replace(str(work), "<data>") for c in command[1:]]
    print("$ " + " ".join(shown), flush=True)
    done = subprocess.run(command, env=perf_analyzer_env(), capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        tail = (done.stdout + "\n" + done.stderr).strip().splitlines()[-6:]
        return {"error": " | ".join(tail)}
    with out.open() as f:
        return next(csv.DictReader(f))


def generator_run(url: str, ensemble: Ensemble, concurrency: int, window: float, warmup: float,
                  sources: dict[str, list]) -> tuple[float, float, float, int]:
    """bench/perf.py's closed loop (bench_completions' streaming one for codegen_stream) ->
    (infer/s, p50 us, p99 us, errors)."""
    if ensemble.model == "codegen_stream":
        result = asyncio.run(bench_completions._measure("grpc", url, None, MAX_TOKENS, concurrency, warmup, window))
    elif ensemble.model == "codegen":
        prompts = itertools.cycle(PROMPTS)
        result = run_load(url, "codegen", lambda: request_inputs(next(prompts), MAX_TOKENS, 0.0, 0, 1.0, 0),
                          concurrency, window, warmup)
    else:
        name = "image" if ensemble.model == "food_captioning" else "text"
        result = run_load(url, ensemble.model, text_inputs_factory(sources[ensemble.model], name), concurrency,
                          window, warmup)
    if not result.latencies:
        return 0.0, float("nan"), float("nan"), result.errors
    return result.throughput, result.percentile(50) * 1e6, result.percentile(99) * 1e6, result.errors


def row(model: str, tool: str, c: int, throughput: float, p50: float, p99: float, note: str = "") -> str:
    return f"{model:>16} {tool:>14} {c:3d} {throughput:9.1f} {p50 / 1e3:9.1f} {p99 / 1e3:9.1f}  {note}"


def run(ctx) -> None:
    binary = ensure_perf_analyzer()
    if binary is None:
        return
    sources = {"text_embedding": embedding_corpus(64), "ner": ner_corpus(64), "food_captioning": photos(8)}
    window = 4.0 if ctx.quick else ctx.window
    with tempfile.TemporaryDirectory() as work:
        lines = []
        header = f"{'model':>16} {'tool':>14} {'c':>3} {'infer/s':>9} {'p50 ms':>9} {'p99 ms':>9}"
        for ensemble in ensembles(sources["text_embedding"], sources["ner"], sources["food_captioning"]):
            for c in CONCURRENCY:
                found = perf_analyzer(binary, ctx.grpc_url, ensemble, c, window, Path(work))
                if "error" in found:
                    line = row(ensemble.model, "perf_analyzer", c, 0, float("nan"), float("nan"),
                               "failed: " + found["error"][:300])
                else:
                    line = row(ensemble.model, "perf_analyzer", c, float(found["Inferences/Second"]),
                               float(found["p50 latency"]), float(found["p99 latency"]))
                print(header + "\n" + line, flush=True)
                throughput, p50, p99, errors = generator_run(ctx.grpc_url, ensemble, c, window, ctx.warmup, sources)
                mine = row(ensemble.model, "bench/perf.py", c, throughput, p50, p99,
                           f"errors {errors}" if errors else "")
                print(mine, flush=True)
                lines += [line, mine]
        print(f"\nperf_analyzer 2.51 (gRPC, {window:.0f} s windows) beside bench/perf.py, {MAX_TOKENS}-token greedy "
              f"completions for codegen*:\n{header}\n" + "\n".join(lines), flush=True)
