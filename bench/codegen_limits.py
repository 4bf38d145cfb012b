"""Served codegen against its peers and its physical limit (issue 53's last two goals), in one run on one box:

- `transformers.generate` in a plain script (a child python, torch with the same threads as the served engine, fp32
  weights, greedy): c1 = its prompts one after another, c16 = one batch of 16 (left-padded). The served side is the
  generator as shipped (every parameter of model_repository/codegen_generator/config.pbtxt: precision auto, threads
  0: the cores Triton may use; --param openvino_threads=1 for one) in a tritonserver of its own, over the same fp32 weights, called directly over
  gRPC streaming (no preprocess or BLS front: the engine served, not the pipeline), with c clients back to back
  (bench_codegen_engines' closed loop and figures). Goals: served / transformers tokens/s >= 1.0 at c1, >= 2 at c16.
- The DRAM bound: a matrix-vector product over a 512 MiB f32 matrix (torch.mv, the same threads), timed --mv-repeats
  times before and after the rest: bandwidth = bytes read / time (the median; the best is printed too). A decode
  step at c1 reads every weight once but the token embedding (one row of it is gathered): bytes per token =
  those parameters x the precision's bytes (2 for bf16: the CPU plugin keeps an fp32 IR's weights in bf16 when it
  infers in bf16; 4 for f32). Goal: the served c1 decode rate (tokens after the first over their time, the median
  of the c1 requests) >= 0.8 x bandwidth / bytes per token.

Model: a GPT-J of codegen-350M-mono's shape, random weights, the demo tokenizer (bench/editor.py's
bench-results/editor-350m/, built once with its fp32 IR). Workload: bench_codegen_engines' 16 short code prompts, 64
tokens each (--new-tokens; transformers is held to exactly that many: min_new_tokens).

    python -m bench.codegen_limits [--levels 1 16] [--new-tokens 64] [--param precision=f32 ...]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from bench import stats
from bench.bench_codegen_engines import PROMPTS, Trace, closed_loop, load_average, summarize

ROOT = Path(__file__).resolve().parent.parent
GENERATOR = "codegen_generator"
MV_BYTES = 512 * 2**20


def threads_here() -> int:
    """The cores this process may use: what the served generator's `openvino_threads` 0 resolves to on this box."""
    return len(os.sched_getaffinity(0))


# ---- the DRAM bound ---------------------------------------------------------------------------------------------

def bandwidth_gb_s(threads: int, repeats: int) -> list[float]:
    """GB/s of each of `repeats` timed torch.mv over a 512 MiB f32 matrix (after one untimed pass)."""
    import torch

    torch.set_num_threads(threads)
    rows = 16384
    matrix = torch.randn(rows, MV_BYTES // 4 // rows)
    vector = torch.randn(matrix.shape[1])
    torch.mv(matrix, vector)
    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        torch.mv(matrix, vector)
        out.append(MV_BYTES / (time.perf_counter() - started) / 1e9)
    return out


def weights_read_per_token(folder: Path) -> int:
    """Parameters a c1 decode step reads (all but the token embedding's, of which it gathers one row)."""
    from safetensors import safe_open

    total = 0
    with safe_open(str(folder / "model.safetensors"), "np") as f:
        for name in f.keys():
            if not name.endswith("wte.weight"):
                total += int(np.prod(f.get_slice(name).get_shape()))
    return total


# ---- transformers.generate in a plain script (a child python) ---------------------------------------------------

def transformers_child(folder: str, threads: int, levels: list[int], new_tokens: int) -> dict:
    import torch
    from transformers import AutoTokenizer, GPTJForCausalLM

    torch.set_num_threads(threads)
    model = GPTJForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.pad_token, tokenizer.padding_side = tokenizer.eos_token, "left"

    def generate(prompts: list[str]) -> int:
        encoded = tokenizer(prompts, return_tensors="pt", padding=True)
        with torch.inference_mode():
            out = model.generate(**encoded, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.eos_token_id)
        return (out.shape[1] - encoded["input_ids"].shape[1]) * len(prompts)

    generate(PROMPTS[:1])  # warm-up
    result = {}
    for level in levels:
        started = time.perf_counter()
        if level == 1:
            tokens = sum(generate([p]) for p in PROMPTS[:2])  # as the served c1: max(c, 2) requests
        else:
            tokens = generate(PROMPTS[:level])
        result[str(level)] = {"tokens": tokens, "tokens_per_s": tokens / (time.perf_counter() - started)}
    return result


def run_transformers(folder: Path, threads: int, levels: list[int], new_tokens: int) -> dict:
    done = subprocess.run([sys.executable, "-m", "bench.codegen_limits", "--child", str(folder), "--threads",
                           str(threads), "--levels", *map(str, levels), "--new-tokens", str(new_tokens)],
                          capture_output=True, text=True, timeout=3600, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"transformers child failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- the served generator ---------------------------------------------------------------------------------------

def served_repository(folder: Path, ir: Path, params: dict) -> Path:
    """bench-results/limits-repository: the generator alone, its shipped config (`params` over its parameters), its
    version folder the 350M-shape model with its IR linked as openvino/."""
    from build import openvino_export

    dest = ROOT / "bench-results" / "limits-repository"
    subprocess.run(["rm", "-rf", str(dest)], check=True)
    version = dest / GENERATOR / "1"
    version.mkdir(parents=True)
    config = (ROOT / "model_repository" / GENERATOR / "config.pbtxt").read_text()
    for key, value in params.items():
        config, found = re.subn(rf'(key: "{key}",? value: {{ string_value: )"[^"]*"', rf'\g<1>"{value}"', config)
        assert found == 1, f"the generator's config has no parameter {key}"
    (dest / GENERATOR / "config.pbtxt").write_text(config)
    for item in folder.iterdir():
        if not item.name.startswith("openvino"):
            (version / item.name).symlink_to(item)
    (version / openvino_export.IR_FOLDER).symlink_to(ir, target_is_directory=True)
    return dest


def generator_send(url: str, tokenize, new_tokens: int):
    """send(prompt, trace) for closed_loop: one streamed request to the generator, greedy."""
    import tritonclient.grpc as grpcclient

    def tensor(name, array):
        t = grpcclient.InferInput(name, list(array.shape), "INT32")
        t.set_data_from_numpy(array)
        return t

    def send(prompt: str, trace: Trace) -> None:
        ids = tokenize(prompt)
        client = grpcclient.InferenceServerClient(url)
        done, failed = threading.Event(), []

        def callback(result, error):
            if error is not None:
                failed.append(error)
                done.set()
                return
            response = result.get_response()
            if response.outputs:
                trace.marks.append((time.perf_counter(), int(result.as_numpy("completion_tokens").reshape(-1)[0])))
            if response.parameters["triton_final_response"].bool_param:
                done.set()

        client.start_stream(callback=callback)
        client.async_stream_infer(GENERATOR, [tensor("input_ids", np.array([ids], np.int32)),
                                              tensor("input_lengths", np.array([[len(ids)]], np.int32)),
                                              tensor("request_output_len", np.array([[new_tokens]], np.int32))],
                                  enable_empty_final_response=True)
        done.wait(1800)
        client.stop_stream()
        client.close()
        if failed:
            raise RuntimeError(f"generator request failed: {failed[0]}")

    return send


def decode_rates(traces: list[Trace]) -> list[float]:
    """Each request's tokens after its first over their time."""
    return [(t.marks[-1][1] - t.marks[0][1]) / (t.marks[-1][0] - t.marks[0][0]) for t in traces
            if len(t.marks) >= 2 and t.marks[-1][0] > t.marks[0][0]]


def run_served(repository: Path, folder: Path, levels: list[int], new_tokens: int) -> dict:
    from tokenizers import Tokenizer

    from launcher.processes import free_port
    from launcher.triton_server import TritonServer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    log = ROOT / "bench-results" / "tritonserver-codegen-limits.log"
    server = TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          model_repository=repository, explicit_models=[GENERATOR], log_file=log)
    with server:
        send = generator_send(server.grpc_url, lambda text: tokenizer.encode(text).ids, new_tokens)
        send(PROMPTS[0], Trace(time.perf_counter()))  # warm-up
        started_line = [line for line in log.read_text(errors="replace").splitlines()
                        if "codegen OpenVINO engine:" in line]
        out = {"engine_line": started_line[-1].split("codegen OpenVINO engine:")[-1].strip() if started_line else "?"}
        for level in levels:
            traces: list[Trace] = []

            def traced(prompt: str, trace: Trace) -> None:
                traces.append(trace)
                send(prompt, trace)

            row = closed_loop(traced, level)
            row["decode_per_s"] = decode_rates(traces)
            out[str(level)] = row
    return out


# ---- the run ----------------------------------------------------------------------------------------------------

def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", nargs="*", type=int, default=[1, 16])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--mv-repeats", type=int, default=10)
    parser.add_argument("--param", nargs="*", default=[], metavar="KEY=VALUE",
                        help="generator config parameters to change (default: as shipped)")
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)  # the child's
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the transformers script
    args = parser.parse_args()
    if args.child:
        print(json.dumps(transformers_child(args.child, args.threads, args.levels, args.new_tokens)))
        return 0
    from bench.editor import model_folder

    threads = threads_here()
    params = dict(item.split("=", 1) for item in args.param)
    folder, ir = model_folder("350m", "fp32")
    print(f"codegen limits: 350M shape, fp32 weights, {threads} thread(s) (this process's CPU affinity), levels "
          f"{args.levels}, {args.new_tokens} tokens, generator parameters {params or 'as shipped'}, load average "
          f"{load_average()}", flush=True)
    before = bandwidth_gb_s(threads, args.mv_repeats)
    print(f"matrix-vector product over {MV_BYTES / 2**20:.0f} MiB, {threads} thread(s): median "
          f"{stats.median(before):.1f} GB/s, best {max(before):.1f} (load {load_average()})", flush=True)
    peer = run_transformers(folder, threads, args.levels, args.new_tokens)
    for level in args.levels:
        print(f"transformers.generate c{level}: {peer[str(level)]['tokens_per_s']:.1f} tokens/s "
              f"(load {load_average()})", flush=True)
    served = run_served(served_repository(folder, ir, params), folder, args.levels, args.new_tokens)
    print(f"served generator: {served['engine_line']}", flush=True)
    for level in args.levels:
        row = served[str(level)]
        print(f"served c{level}: {row['tokens_per_s']:.1f} tokens/s, TTFT p50 {row['ttft_p50_ms']:.0f} ms, decode "
              f"p50 {stats.median(row['decode_per_s']):.1f} tokens/s per request (load {load_average()})", flush=True)
    after = bandwidth_gb_s(threads, args.mv_repeats)
    print(f"matrix-vector product again: median {stats.median(after):.1f} GB/s, best {max(after):.1f} "
          f"(load {load_average()})", flush=True)

    precision = re.search(r"(\w+) precision", served["engine_line"])
    precision = precision.group(1) if precision else "f32"
    per_token = weights_read_per_token(folder) * (2 if precision == "bf16" else 4)
    bandwidth = stats.median(before + after)
    bound = bandwidth * 1e9 / per_token
    print("\ngoals:")
    for level, goal in ((1, 1.0), (16, 2.0)):
        if str(level) in served and str(level) in peer:
            ratio = served[str(level)]["tokens_per_s"] / peer[str(level)]["tokens_per_s"]
            print(f"  served ({params or 'default settings'}) / transformers.generate tokens/s at c{level}: "
                  f"{ratio:.2f}x (goal >= {goal}x) {verdict(ratio >= goal)}")
    if "1" in served:
        decode = stats.median(served["1"]["decode_per_s"])
        print(f"  c1 decode at {precision}: {decode:.1f} tokens/s against the bound {bandwidth:.1f} GB/s / "
              f"{per_token / 1e9:.2f} GB per token = {bound:.1f} tokens/s: {decode / bound:.2f} (goal >= 0.8) "
              f"{verdict(decode >= 0.8 * bound)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
