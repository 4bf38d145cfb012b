"""What logprobs and token healing cost the generator (issue 44), per engine, in process (Triton-free): generated
tokens/s of a batch of requests that ask for nothing, for logprobs=0 (the chosen tokens' logprobs), for logprobs=5
(five alternatives: on OpenVINO these come from the scorer, a forward per token), the time to the first token of
prompts ending in a newline with token healing and without, and what logprobs=5 requests cost plain requests
beside them (the plain ones' own tokens/s; OpenVINO's scorer unbounded, then bounded by max_scored_rows as
served). Rounds are interleaved; medians are printed with the load average (this box is shared), and the median
of each round's ratio to that round's plain run.

    python -m bench.bench_logprobs [--rounds 3] [--requests 8] [--tokens 64] [--model-dir DIR] [--engines ...]
                                   [--variants "logprobs=0" ...] [--max-scored-rows 1 2 ...]
"""
from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

from bench import stats

ROOT = Path(__file__).resolve().parent.parent

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


def run(engine, requests, measured: int | None = None) -> tuple[float, float, float]:
    """(generated tokens/s, median time to first token in ms) of the batch's first `measured` requests (all by
    default), the rest being their batch-mates, and the batch-mates' tokens/s (0 when there are none)."""
    sinks = [Sink() for _ in requests]
    started = time.perf_counter()
    for request, sink in zip(requests, sinks):
        engine.submit(request, sink)
    ends = []
    for sink in sinks:
        assert sink.done.wait(600) and sink.error is None, sink.error
        ends.append(time.perf_counter())
    mine, others = sinks[:measured], sinks[len(sinks[:measured]):]
    elapsed = max(ends[:len(mine)]) - started
    ttft = stats.median((s.first_at or time.perf_counter()) - started for s in mine) * 1000
    others_speed = sum(s.count for s in others) / (max(ends) - started) if others else 0.0
    return sum(s.count for s in mine) / elapsed, ttft, others_speed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--model-dir", type=Path, default=ROOT / "model_repository" / "codegen_generator" / "1")
    parser.add_argument("--engines", nargs="+", default=["openvino", "torch"])
    parser.add_argument("--variants", nargs="+", help="a subset of the variants (plain is always run)")
    parser.add_argument("--max-scored-rows", type=int, nargs="+", default=[1],
                        help="the bounds of the mixed variants (config.pbtxt's max_scored_rows: 1)")
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
        "logprobs=5, unbounded": lambda: [GenerationRequest(i, args.tokens, logprobs=5) for i in ids],
        # the plain requests' own speed with as many logprobs=5 requests beside them, the scorer unbounded (every
        # row followed at once) and bounded as served (config.pbtxt's max_scored_rows): what those cost others
        "plain beside logprobs=5, unbounded": lambda: [GenerationRequest(i, args.tokens) for i in ids]
        + [GenerationRequest(i, args.tokens, logprobs=5) for i in ids],
        **{f"plain beside logprobs=5, max_scored_rows={bound}": lambda: [GenerationRequest(i, args.tokens) for i in ids]
           + [GenerationRequest(i, args.tokens, logprobs=5) for i in ids] for bound in args.max_scored_rows},
        "newline, healing off": lambda: [GenerationRequest(i, args.tokens) for i in healed],
        "newline, healed": lambda: [GenerationRequest(i[:-1], args.tokens, heal_prefix=bytes(
            tokenizer.decode([i[-1]]), "utf-8")) for i in healed],
    }
    if args.variants:
        variants = {name: make for name, make in variants.items() if name == "plain" or name in args.variants}
    for kind in args.engines:
        engine = load_engine(kind, args.model_dir, max_batch_size=2 * args.requests, max_tokens_limit=512)

        served = getattr(engine, "max_scored_rows", None)  # OpenVINO's (config default); torch has no scorer to bound

        def measure(name: str, make) -> tuple[float, float, float]:
            if served is not None:  # every variant under its own bound: the served one unless it names another
                engine.max_scored_rows = (int(name.rsplit("=", 1)[1]) if "max_scored_rows" in name
                                          else 2 * args.requests if "unbounded" in name else served)
            if "beside" not in name:
                return run(engine, make())
            return run(engine, make(), measured=args.requests)

        try:
            for name, make in variants.items():  # warm-up (compiles the OpenVINO scorer too)
                measure(name, make)
            results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
            for _ in range(args.rounds):
                for name, make in variants.items():
                    results[name].append(measure(name, make))
            plain = stats.median(r[0] for r in results["plain"])
            paired = {name: stats.median(r[0] / p[0] for r, p in zip(rows, results["plain"]))
                      for name, rows in results.items()}
            print(f"\n{kind} engine, {args.model_dir}, {args.requests} requests x {args.tokens} greedy tokens, "
                  f"{args.rounds} rounds, load {os.getloadavg()[0]:.1f}")
            for name, rows in results.items():
                speed, ttft = stats.median(r[0] for r in rows), stats.median(r[1] for r in rows)
                mates = stats.median(r[2] for r in rows)
                print(f"  {name:44s} {speed:9.1f} tokens/s  (x{speed / plain:.3f} of plain, "
                      f"paired x{paired[name]:.3f})  "
                      f"TTFT p50 {ttft:7.1f} ms   rounds {[round(r[0]) for r in rows]}"
                      + (f"   the logprobs=5 ones {mates:.1f} tokens/s" if mates else ""))
        finally:
            engine.close()


if __name__ == "__main__":
    main()
