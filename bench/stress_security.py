"""Hunts internal errors (issue 25: "21 unexplained 500s" in one bench_security run): a keyed gateway in
front of a real Triton gets a mix of valid and invalid traffic at once, for `--seconds`:

- `ok`: POST /v1/embeddings, one sentence (200);
- `abort`: the same, dropped by the client after 0-40 ms (the gateway sees a disconnect mid-request);
- `chunked`: a valid body without Content-Length, sent in three pieces (200);
- `chunked_abort`: a chunked body the client drops half-way;
- `over_cap`: a chunked body over /v1/ner's cap (413);
- `tight`: a key limited to 20 req/s and 2 in flight (200 or 429);
- `bad_json`: invalid and deeply nested JSON (400);
- `admin_nested`: an admin route with a deeply nested body (400, audited).

It counts every status per kind, and afterwards the gateway log's internal errors and unhandled
exceptions. Exit status 1 when any answer was a 5xx other than 503 or the log has an internal error.

    .venv/bin/python -m bench.stress_security [--seconds 30] [--concurrency 32] [--log-dir DIR]
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import random
import sys
import tempfile
from pathlib import Path

import aiohttp

from bench import load
from launcher.gateway_process import GatewayProcess
from launcher.processes import free_port
from launcher.triton_server import TritonServer

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
KEYS = {"main": "gk-stress-main-0123456789", "tight": "gk-stress-tight-0123456789",
        "admin": "gk-stress-admin-0123456789"}
FIRST_CLIENT_ERROR: dict[tuple[str, str], str] = {}  # (kind, exception type) -> its first message
KINDS = ("ok", "abort", "chunked", "chunked_abort", "over_cap", "tight", "bad_json", "admin_nested")


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}", "Content-Type": "application/json"}


def sentence() -> str:
    return f"stress sentence {random.randrange(10**6)} about the weather and the sea"


async def pieces(parts: list[bytes], pause: float, stop_after: int | None = None):
    for i, part in enumerate(parts):
        if stop_after is not None and i == stop_after:
            raise ConnectionAbortedError("client drops the body")  # aiohttp closes the connection
        yield part
        await asyncio.sleep(pause)


async def one(session: aiohttp.ClientSession, base: str, kind: str) -> str:
    body = f'{{"model": "{MODEL}", "input": "{sentence()}"}}'.encode()
    try:
        if kind in ("ok", "abort"):
            request = session.post(f"{base}/v1/embeddings", data=body, headers=bearer("main"))
            if kind == "abort":
                try:
                    async with asyncio.timeout(random.uniform(0, 0.04)):
                        async with request as response:
                            await response.read()
                            return str(response.status)
                except TimeoutError:
                    return "aborted"
        elif kind in ("chunked", "chunked_abort"):
            third = len(body) // 3
            parts = [body[:third], body[third:2 * third], body[2 * third:]]
            request = session.post(f"{base}/v1/embeddings", headers=bearer("main"),
                                   data=pieces(parts, 0.005, 2 if kind == "chunked_abort" else None))
        elif kind == "over_cap":  # /v1/ner's cap: one text of MAX_TEXT_BYTES and a little
            request = session.post(f"{base}/v1/ner", headers=bearer("main"),
                                   data=pieces([b'{"text": "' + b"x" * 65536] * 4 + [b'"}'], 0.001))
        elif kind == "tight":
            request = session.post(f"{base}/v1/embeddings", data=body, headers=bearer("tight"))
        elif kind == "bad_json":
            data = random.choice([b"{", b"[" * 5000 + b"]" * 5000, b'{"model": NaN}', b"\xff\xfe", b""])
            request = session.post(f"{base}/v1/embeddings", data=data, headers=bearer("main"))
        else:
            data = random.choice([b"[" * 5000 + b"]" * 5000, b'{"model_name": ' + b"[" * 3000])
            request = session.post(f"{base}/unload_model", data=data, headers=bearer("admin"))
        async with request as response:
            await response.read()
            return str(response.status)
    except (aiohttp.ClientError, ConnectionAbortedError, asyncio.TimeoutError) as exc:
        if kind.endswith("abort"):
            return "aborted"
        FIRST_CLIENT_ERROR.setdefault((kind, type(exc).__name__), repr(exc)[:300])
        return f"client {type(exc).__name__}"


WEIGHTS = dict(zip(KINDS, (6, 3, 2, 1, 1, 2, 1, 1)))


async def hammer(base: str, seconds: float, concurrency: int, kinds=KINDS) -> dict[str, collections.Counter]:
    """bench/load.py's closed loop for `seconds`, each request of a kind drawn by WEIGHTS: kind -> answers."""
    counts: dict[str, collections.Counter] = {kind: collections.Counter() for kind in kinds}
    weights = [WEIGHTS[kind] for kind in kinds]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency),
                                     timeout=aiohttp.ClientTimeout(total=60)) as session:
        async def request(call: load.Call) -> tuple[str, str]:
            kind = random.choices(kinds, weights)[0]
            return kind, await one(session, base, kind)

        run = await load.run_async(request, concurrency, duration=seconds)
    for record in run.every:  # one() answers for every failure it expects: anything else ends the bench, as before
        if not record.ok:
            raise RuntimeError(f"stress request failed unexpectedly: {record.error}")
        kind, answer = record.value
        counts[kind][answer] += 1
    return counts


@contextlib.contextmanager
def keyed_stack(tmp: Path, logs: Path, key_lines: str, env: dict[str, str] | None = None):
    """A Triton serving text_embedding and a gateway in front of it with the keys of `key_lines` (logs
    in `logs`): yields the started GatewayProcess, stops both."""
    logs.mkdir(parents=True, exist_ok=True)
    keys = tmp / "keys"
    keys.write_text(key_lines)
    with TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                      explicit_models=["text_embedding"], log_file=logs / "tritonserver.log",
                      extra_repositories=[tmp / "data" / "triton_models"]) as server:
        gateway = GatewayProcess(server.grpc_url, port=free_port(), data_dir=tmp / "data",
                                 log_file=logs / "gateway.log", env={"GATEWAY_API_KEYS_FILE": str(keys), **(env or {})})
        try:
            yield gateway.start(timeout=180)
        finally:
            gateway.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, of: " + ", ".join(KINDS))
    parser.add_argument("--log-dir", type=Path, help="keep the gateway's and Triton's logs here")
    args = parser.parse_args()
    from gateway.keys import key_line

    with tempfile.TemporaryDirectory(prefix="stress-security-") as tmp:
        tmp = Path(tmp)
        logs = args.log_dir or tmp
        key_lines = (key_line(KEYS["main"], "main", "inference", rps=100_000, concurrency=256)
                     + key_line(KEYS["tight"], "tight", "inference", rps=20, concurrency=2)
                     + key_line(KEYS["admin"], "admin", "admin"))
        with keyed_stack(tmp, logs, key_lines) as gateway:
            counts = asyncio.run(hammer(gateway.url, args.seconds, args.concurrency, args.kinds.split(",")))
        log = (logs / "gateway.log").read_text(errors="replace")
    bad = 0
    for kind, counter in counts.items():
        print(f"{kind:14} {dict(sorted(counter.items()))}")
        bad += sum(n for status, n in counter.items() if status.startswith("5") and status != "503")
    for (kind, name), message in FIRST_CLIENT_ERROR.items():
        print(f"first client error of {kind}: {message}")
    internal, unhandled = log.count("internal error "), log.count("Exception in ASGI application")
    print(f"answers 5xx (not 503): {bad}; gateway log: {internal} internal errors, {unhandled} unhandled exceptions")
    if internal or unhandled:
        lines = log.splitlines()
        start = next(i for i, line in enumerate(lines) if "internal error " in line or "Exception in ASGI" in line)
        print("--- gateway log from the first:\n" + "\n".join(lines[start:start + 40]))
    return 1 if bad or internal or unhandled else 0


if __name__ == "__main__":
    sys.exit(main())
