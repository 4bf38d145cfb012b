"""What logprobs and token healing cost the generator (issue 44), per engine, in process (Triton-free): generated
tokens/s of a batch of requests that ask for nothing, for logprobs=0 (the chosen tokens' logprobs), for logprobs=5
(five alternatives: on OpenVINO these come from the scorer, a forward per token), and the time to the first token
of prompts ending in a newline with token healing and without. Rounds are interleaved; medians are printed with
the load average (this box is shared), and the median of each round's ratio to that round's plain run.

    python bench/bench_logprobs.py [--rounds 3] [--requests 8] [--tokens 64] [--model-dir DIR] [--engines ...]
                                   [--variants "logprobs=0" ...]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "backends"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

PROMPTS = ["while True:\n    x = ", "import os\nimport sys\n\n\ndef main(", "class Stack:\n    def push(self, item",
           "for i in range(10):\n    print(", "x = [1, 2, 3, 4, 5, 6,", "def add(a, b):\n    return a +",
           "# read a file\nwith open(", "data = {\n    'a': 1,\n    'b':"]
HEAL_PROMPTS = ["def is_prime(n):\n", "def mean(values):\n", "class Foo:\n    ", "def close(self):\n",
                "import os\n", "while True:\n", "def read(path):\n", "for i in range(3):\n"]


class Sink:
    """Counts the ids a client would receive and notes when the first came; never cancelled."""

    def __init__(self):
        self.count, self.first_at, self.done, self.error = 0, None, threading.Event(), None

    def cancelled(self):
        return False

    def send(self, token_ids, logprobs=None, prompt_logprobs=None):
        if self.first_at is None and token_ids:
            self.first_at = time.perf_counter()
        self.count += len(token_ids)

    def finish(self, reason, token_ids, logprobs=None, prompt_logprobs=None):
        self.send(token_ids)
        self.end()

    def fail(self, error):
        self.end(error)

    def end(self, error=None):
        self.error = error
        self.done.set()


def run(engine, requests) -> tuple[float, float]:
    """(generated tokens/s of the batch, median time to first token in ms)."""
    sinks = [Sink() for _ in requests]
    started = time.perf_counter()
    for request, sink in zip(requests, sinks):
        engine.submit(request, sink)
    for sink in sinks:
        assert sink.done.wait(600) and sink.error is None, sink.error
    elapsed = time.perf_counter() - started
    ttft = statistics.median((s.first_at or time.perf_counter()) - started for s in sinks) * 1000
    return sum(s.count for s in sinks) / elapsed, ttft


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--model-dir", type=Path, default=ROOT / "model_repository" / "codegen_generator" / "1")
    parser.add_argument("--engines", nargs="+", default=["openvino", "torch"])
    parser.add_argument("--variants", nargs="+", help="a subset of the variants (plain is always run)")
    args = parser.parse_args()

    import torch
    from tokenizers import Tokenizer

    from gptj_generator.loading import load_engine
    from gptj_generator.seam import GenerationRequest

    torch.set_num_threads(1)
    tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    ids = [tokenizer.encode(p).ids for p in (PROMPTS * args.requests)[:args.requests]]
    healed = [tokenizer.encode(p).ids for p in (HEAL_PROMPTS * args.requests)[:args.requests]]
    variants = {
        "plain": lambda: [GenerationRequest(i, args.tokens) for i in ids],
        "logprobs=0": lambda: [GenerationRequest(i, args.tokens, logprobs=0) for i in ids],
        "logprobs=5": lambda: [GenerationRequest(i, args.tokens, logprobs=5) for i in ids],
        "newline, healing off": lambda: [GenerationRequest(i, args.tokens) for i in healed],
        "newline, healed": lambda: [GenerationRequest(i[:-1], args.tokens, heal_prefix=bytes(
            tokenizer.decode([i[-1]]), "utf-8")) for i in healed],
    }
    if args.variants:
        variants = {name: make for name, make in variants.items() if name == "plain" or name in args.variants}
    for kind in args.engines:
        engine = load_engine(kind, args.model_dir, max_batch_size=16, max_tokens_limit=512)
        try:
            for make in variants.values():  # warm-up (compiles the OpenVINO scorer too)
                run(engine, make())
            results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
            for _ in range(args.rounds):
                for name, make in variants.items():
                    results[name].append(run(engine, make()))
            plain = statistics.median(r[0] for r in results["plain"])
            paired = {name: statistics.median(r[0] / p[0] for r, p in zip(rows, results["plain"]))
                      for name, rows in results.items()}
            print(f"\n{kind} engine, {args.model_dir}, {args.requests} requests x {args.tokens} greedy tokens, "
                  f"{args.rounds} rounds, load {os.getloadavg()[0]:.1f}")
            for name, rows in results.items():
                speed, ttft = statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
                print(f"  {name:22s} {speed:9.1f} tokens/s  (x{speed / plain:.3f} of plain, paired x{paired[name]:.3f})  "
                      f"TTFT p50 {ttft:7.1f} ms   rounds {[round(r[0]) for r in rows]}")
        finally:
            engine.close()


if __name__ == "__main__":
    main()
