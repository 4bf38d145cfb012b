"""A burst of streamed completions through the gateway, as a load generator's sweep sends it (issue 55's
"done when"): 512 requests from 256 concurrent streams, each prompt 128 token ids, each asking for 32 tokens.
Every request should complete (200 and its `[DONE]`), none refused: the sequences beyond COMPLETIONS_SLOTS wait
in the gateway's queue. Prints the counts, the wall time, and time to first token and latency percentiles.

    python -m bench.completions_burst                       (starts its own Triton + gateway on free ports)
    python -m bench.completions_burst --url http://127.0.0.1:8080 [--requests 512 --streams 256 ...]

Prompts are token ids (the model's own, cut from the repository's Python sources, a different window each), so
each is exactly --prompt-tokens long. Exits 1 unless every request completed.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time
from pathlib import Path

import aiohttp

from bench import stats
from bench.completions_stack import completions_stack

ROOT = Path(__file__).resolve().parent.parent
GENERATOR_DIR = ROOT / "model_repository" / "codegen_generator" / "1"


def prompts(count: int, length: int) -> list[list[int]]:
    """`count` windows of `length` token ids over the gateway's own sources, each starting 37 tokens on."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(GENERATOR_DIR))
    text = "\n".join(p.read_text() for p in sorted((ROOT / "gateway").rglob("*.py")))
    ids = tokenizer(text)["input_ids"]
    return [ids[(i * 37) % (len(ids) - length):][:length] for i in range(count)]


async def one(session: aiohttp.ClientSession, url: str, prompt: list[int], max_tokens: int, seed: int) -> dict:
    body = {"model": "codegen", "prompt": prompt, "max_tokens": max_tokens, "stream": True, "seed": seed,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    usage, finish, done = {}, None, False
    async with session.post(url + "/v1/completions", json=body) as response:
        if response.status != 200:
            return {"status": response.status, "error": (await response.read())[:200].decode(errors="replace")}
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                continue
            event = json.loads(data)
            for choice in event.get("choices", []):
                first = first or time.perf_counter()
                finish = choice.get("finish_reason") or finish
            usage = event.get("usage") or usage
    end = time.perf_counter()
    return {"status": 200, "done": done, "finish": finish, "ttft": (first or end) - t0, "latency": end - t0,
            "prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": usage.get("completion_tokens", 0)}


async def burst(url: str, requests: int, streams: int, prompt_tokens: int, max_tokens: int) -> tuple[list, float]:
    work = prompts(requests, prompt_tokens)
    queue = collections.deque(enumerate(work))
    results: list = [None] * requests
    connector = aiohttp.TCPConnector(limit=streams)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=1800)) as session:
        async def stream_worker() -> None:  # closed loop: the next request as soon as this stream's last ended
            while queue:
                i, prompt = queue.popleft()
                try:
                    results[i] = await one(session, url, prompt, max_tokens, seed=i)
                except Exception as error:  # noqa: BLE001 - counted and printed, the burst goes on
                    results[i] = {"status": None, "error": f"{type(error).__name__}: {error}"}

        t0 = time.perf_counter()
        await asyncio.gather(*(stream_worker() for _ in range(streams)))
        return results, time.perf_counter() - t0


def report(results: list[dict], seconds: float, args) -> int:
    completed = [r for r in results if r["status"] == 200 and r["done"] and r["finish"]]
    statuses = collections.Counter(str(r["status"]) for r in results)
    finishes = collections.Counter(r["finish"] for r in completed)
    tokens = sum(r["completion_tokens"] or 0 for r in completed)
    print(f"burst: {args.requests} requests, {args.streams} concurrent streams, {args.prompt_tokens}-token prompts "
          f"(token ids), max_tokens {args.max_tokens}, stream=true")
    print(f"  completed (200 + [DONE]): {len(completed)} of {len(results)}; HTTP statuses "
          f"{dict(sorted(statuses.items()))}; finish_reason {dict(finishes)}")
    print(f"  prompt tokens per request: {sorted({r['prompt_tokens'] for r in completed})}; completion tokens "
          f"{tokens} in all ({tokens / max(len(completed), 1):.1f} per request)")
    print(f"  wall time {seconds:.1f} s: {len(completed) / seconds:.1f} requests/s, {tokens / seconds:.0f} tokens/s")
    if completed:
        ttft = [r["ttft"] for r in completed]
        latency = [r["latency"] for r in completed]
        print(f"  time to first token p50 {stats.percentile(ttft, 50):.1f} s, p99 {stats.percentile(ttft, 99):.1f} s;"
              f" latency p50 {stats.percentile(latency, 50):.1f} s, p99 {stats.percentile(latency, 99):.1f} s")
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        print(f"  first error: {errors[0]}")
    return 0 if len(completed) == len(results) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running gateway (default: start Triton and a gateway here)")
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()

    def go(url: str) -> int:
        results, seconds = asyncio.run(burst(url.rstrip("/"), args.requests, args.streams, args.prompt_tokens,
                                             args.max_tokens))
        return report(results, seconds, args)

    if args.url:
        return go(args.url)
    with completions_stack() as url:
        return go(url)


if __name__ == "__main__":
    sys.exit(main())
