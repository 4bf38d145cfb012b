"""A normal client beside abusive ones (issue 43, items 1, 2 and 4): does the gateway keep serving it?

A keyed gateway in front of a real Triton (text_embedding). The normal client sends one-sentence
POST /v1/embeddings from its own address (127.0.0.2) at `--concurrency`, for `--seconds`, once alone
(quiet) and once while the abusers run, `--rounds` times in turn. The abusers run in a process of their
own (their CPU is theirs, not the normal client's event loop), each from an address of its own:

- `hog` (item 1), another key: bodies that take the body budget and stall. One declares the whole
  BODY_BUFFER_BYTES and sends nothing, one declares 27 MiB and sends nothing, four declare 20 MiB and
  send 8 MiB of it (32 MiB, over the key's share); each reconnects as soon as it is answered (413, 503,
  or 408 after BODY_TIMEOUT_S).
- `flood` (item 2), no key: `--flood` sockets that send `GET /health HTTP/1.1` and half a header, and
  never finish; each opens again `--flood-reconnect-s` after the gateway closes it.
- `png` (item 4): POST /infer with a 1x1 PNG carrying 64 zTXt chunks of 1 MiB each (67 KB on the wire),
  two at a time (to a model that is not loaded: the image is checked before the model is looked up).

Prints, per round and phase, the normal client's requests, p50 and errors, then the quiet/abused p50
ratio and what the abusers got. Goal: 0 errors, p50 within 2x quiet. Exit status 1 when missed.

    .venv/bin/python -m bench.stress_abuse [--seconds 15] [--rounds 2] [--concurrency 4] [--log-dir DIR]
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import json
import multiprocessing
import random
import resource
import struct
import sys
import tempfile
import time
import zlib
from pathlib import Path

import aiohttp

from bench import load, stats
from bench.stress_security import MODEL, keyed_stack

KEYS = {"main": "gk-abuse-main-0123456789", "hog": "gk-abuse-hog-0123456789"}
# one address per client, as on a network (the connection cap is per address): Linux routes 127.0.0.0/8 to lo
NORMAL_ADDRESS = "127.0.0.2"
ADDRESSES = {"hog": "127.0.0.3", "flood": "127.0.0.1", "png": "127.0.0.4"}
MIB = 1 << 20
ABUSERS = ("hog", "flood", "png")


# --- the normal client ---

async def normal_client(base: str, seconds: float, concurrency: int) -> dict:
    """bench/load.py's closed loop for `seconds`: every request sent counts (the abuse is what is measured)."""
    headers = {"Authorization": f"Bearer {KEYS['main']}"}
    connector = aiohttp.TCPConnector(limit=concurrency, local_addr=(NORMAL_ADDRESS, 0))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        async def request(call: load.Call) -> None:
            body = {"model": MODEL, "input": f"a normal sentence {random.randrange(10**6)} about the sea"}
            async with session.post(f"{base}/v1/embeddings", json=body, headers=headers) as response:
                await response.read()
            if response.status != 200:
                raise load.Failed(str(response.status))

        run = await load.run_async(request, concurrency, duration=seconds,
                                   describe_error=lambda e: str(e) if isinstance(e, load.Failed) else type(e).__name__)
    errors = collections.Counter(r.error for r in run.every if not r.ok)
    return {"requests": len(run.every), "errors": dict(errors), "p50_ms": stats.median(r.latency for r in run.every
                                                                                      if r.ok) * 1000}


# --- the abusers ---

def ztxt_png(chunks: int = 64, size: int = MIB) -> bytes:
    """A 1x1 grey PNG with `chunks` zTXt chunks that each inflate to `size` bytes."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    text = chunk(b"zTXt", b"Comment\0\0" + zlib.compress(b"\0" * size, 9))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
            + text * chunks + chunk(b"IDAT", zlib.compress(b"\0\0")) + chunk(b"IEND", b""))


async def status_of(reader: asyncio.StreamReader) -> str:
    line = await reader.readline()
    return line.split()[1].decode() if line.startswith(b"HTTP/") else "closed"


async def hog(host: str, port: int, declared: int, sent: int, counts: collections.Counter) -> None:
    """One connection at a time: a body that declares `declared` bytes, sends `sent` of them and stalls."""
    kind = f"hog {declared >> 20} MiB declared, {sent >> 20} sent"
    head = (f"POST /infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEYS['hog']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n").encode()
    body = b'{"model_name": "hog", "text": ["' + b"a" * max(0, sent - 32)
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port, local_addr=(ADDRESSES["hog"], 0))
            writer.write(head)
            for at in range(0, sent, MIB):
                writer.write(body[at:at + MIB])
                await writer.drain()
            counts[f"{kind}: stalled"] += 1
            counts[f"{kind}: {await status_of(reader)}"] += 1
            writer.close()
        except OSError as exc:
            counts[f"{kind}: {type(exc).__name__}"] += 1
        await asyncio.sleep(0.1)


async def flood_socket(host: str, port: int, reconnect_s: float, counts: collections.Counter) -> None:
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port, local_addr=(ADDRESSES["flood"], 0))
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
            counts[f"flood {await status_of(reader)}"] += 1  # a 503 at once, or closed at HEADER_TIMEOUT_S
            writer.close()
        except OSError as exc:
            counts[f"flood {type(exc).__name__}"] += 1
        await asyncio.sleep(reconnect_s)


async def png_sender(base: str, counts: collections.Counter) -> None:
    image = base64.b64encode(ztxt_png()).decode()
    body = json.dumps({"model_name": "not-loaded", "image": [image]})
    headers = {"Authorization": f"Bearer {KEYS['hog']}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=2, local_addr=(ADDRESSES["png"], 0))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        async def one():
            while True:
                try:
                    async with session.post(f"{base}/infer", data=body, headers=headers) as response:
                        await response.read()
                        counts[f"png {response.status}"] += 1
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    counts[f"png {type(exc).__name__}"] += 1

        await asyncio.gather(one(), one())


def run_abusers(base: str, kinds: list[str], flood: int, reconnect_s: float, budget: int, report) -> None:
    """In a child process until terminated; every second it sends its counts to `report` (a Pipe end)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, flood + 1024)), hard))
    host, port = base.removeprefix("http://").split(":")
    counts: collections.Counter = collections.Counter()

    async def main():
        tasks = []
        if "hog" in kinds:
            for declared, sent in [(budget, 0), (27 * MIB, 0)] + [(20 * MIB, 8 * MIB)] * 4:
                tasks.append(hog(host, int(port), declared, sent, counts))
        if "flood" in kinds:
            tasks += [flood_socket(host, int(port), reconnect_s, counts) for _ in range(flood)]
        if "png" in kinds:
            tasks.append(png_sender(base, counts))

        async def reporter():
            while True:
                await asyncio.sleep(1.0)
                report.send(dict(counts))

        await asyncio.gather(reporter(), *tasks)

    asyncio.run(main())


# --- the comparison ---

def compare(base: str, args, budget: int) -> tuple[list[dict], dict]:
    rows, abused_counts = [], {}
    for round_no in range(1, args.rounds + 1):
        quiet = asyncio.run(normal_client(base, args.seconds, args.concurrency))
        receiver, sender = multiprocessing.Pipe(duplex=False)
        abusers = multiprocessing.Process(target=run_abusers, daemon=True, args=(
            base, args.abusers.split(","), args.flood, args.flood_reconnect_s, budget, sender))
        abusers.start()
        try:
            time.sleep(args.ramp)  # the flood and the held bodies in place before the normal client runs
            abused = asyncio.run(normal_client(base, args.seconds, args.concurrency))
            while receiver.poll():
                abused_counts = receiver.recv()
        finally:
            abusers.terminate()
            abusers.join(10)
        time.sleep(2.0)  # the abusers' sockets closed before the next quiet window
        rows.append({"round": round_no, "quiet": quiet, "abused": abused})
    return rows, abused_counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="each window of the normal client")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4, help="of the normal client")
    parser.add_argument("--abusers", default=",".join(ABUSERS), help="comma-separated, of: " + ", ".join(ABUSERS))
    parser.add_argument("--flood", type=int, default=1100, help="half-open sockets of the flood")
    parser.add_argument("--flood-reconnect-s", type=float, default=1.0)
    parser.add_argument("--ramp", type=float, default=3.0, help="seconds the abusers run before the window")
    parser.add_argument("--env", nargs="*", default=[],
                        help="KEY=VALUE for the gateway (e.g. MAX_CONNECTIONS_PER_CLIENT=0)")
    parser.add_argument("--log-dir", type=Path, help="keep the gateway's and Triton's logs here")
    args = parser.parse_args()
    from gateway.keys import key_line
    from gateway.settings import Settings

    env = dict(item.split("=", 1) for item in args.env)
    budget = Settings.from_env(env).body_buffer_bytes
    with tempfile.TemporaryDirectory(prefix="stress-abuse-") as tmp:
        tmp = Path(tmp)
        key_lines = (key_line(KEYS["main"], "main", "inference", rps=100_000, concurrency=256)
                     + key_line(KEYS["hog"], "hog", "inference", rps=100_000, concurrency=256))
        with keyed_stack(tmp, args.log_dir or tmp, key_lines, env) as gateway:
            asyncio.run(normal_client(gateway.url, 2.0, args.concurrency))  # warm-up
            rows, abused_counts = compare(gateway.url, args, budget)
    abusers = ", ".join(f"{k} from {ADDRESSES[k]}" for k in args.abusers.split(","))
    print(f"normal client: c={args.concurrency}, {args.seconds:g} s windows, from {NORMAL_ADDRESS}; abusers: "
          f"{abusers}; gateway env {env or 'default'}")
    print("| round | phase | requests | p50 ms | errors |")
    print("|---|---|---|---|---|")
    for row in rows:
        for phase in ("quiet", "abused"):
            r = row[phase]
            print(f"| {row['round']} | {phase} | {r['requests']} | {r['p50_ms']:.2f} | {sum(r['errors'].values())} "
                  f"{r['errors'] or ''} |")
    quiet_p50 = stats.median(row["quiet"]["p50_ms"] for row in rows)
    abused_p50 = stats.median(row["abused"]["p50_ms"] for row in rows)
    errors = sum(sum(row["abused"]["errors"].values()) for row in rows)
    ratio = abused_p50 / quiet_p50
    print(f"p50 quiet {quiet_p50:.2f} ms, abused {abused_p50:.2f} ms: {ratio:.2f}x; "
          f"errors beside the abusers: {errors}")
    print("abusers' answers in the last round: " + ", ".join(f"{k}: {v}" for k, v in sorted(abused_counts.items())))
    met = errors == 0 and ratio <= 2.0
    print("goal (0 errors, p50 within 2x quiet): " + ("met" if met else "MISSED"))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
