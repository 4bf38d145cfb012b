"""What a newcomer waits for (issue 57): a fresh clone of this checkout's HEAD, `make setup`, then `make triton`
with an empty model cache ($XDG_CACHE_HOME), each pipeline's route asked every 2 s until it answers 200; then the
same clone's models deleted and `make model` timed again with the cache the first run filled (a second clone on
the same machine). Prints when each route first answered 503 (with its Retry-After and message) and 200.

    python -m bench.first_answer [--folder /tmp/first-answer] [--keep]

It uses the default ports (8000-8002, 8010-8012, 8080), as a newcomer's `make triton` does: nothing else may
listen there. About 20 minutes on 2 cores (the trainings); the clone's .venv takes ~6 GB until deleted."""
from __future__ import annotations

import argparse
import base64
import io
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent


def png() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 100, 50)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


CALLS = {
    "embeddings": ("/v1/embeddings", {"input": "hello", "model": "sentence-transformers/all-MiniLM-L6-v2"}),
    "ner": ("/v1/ner", {"text": "Ada Lovelace was born in London."}),
    "caption": ("/v1/caption", {"image": png()}),
    "completions": ("/v1/completions", {"model": "codegen", "prompt": "def add(a, b):", "max_tokens": 8}),
}


def timed(command: list[str], cwd: Path, env: dict, log: Path) -> float:
    start = time.monotonic()
    with open(log, "wb") as out:
        subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, check=True)
    return time.monotonic() - start


def first_answers(clone: Path, env: dict, log: Path, limit_s: float) -> dict[str, float]:
    start = time.monotonic()
    with open(log, "wb") as out:
        stack = subprocess.Popen(["make", "triton"], cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    served: dict[str, float] = {}
    waiting: set[str] = set()
    http = httpx.Client(base_url="http://127.0.0.1:8080", timeout=30)
    try:
        while len(served) < len(CALLS) and time.monotonic() - start < limit_s and stack.poll() is None:
            for name, (path, body) in CALLS.items():
                if name in served:
                    continue
                try:
                    r = http.post(path, json=body)
                except httpx.HTTPError:
                    continue
                at = time.monotonic() - start
                if r.status_code == 200:
                    served[name] = at
                    print(f"{name}: 200 at {at:.0f} s", flush=True)
                elif r.status_code == 503 and name not in waiting:
                    waiting.add(name)
                    print(f"{name}: 503 at {at:.0f} s, Retry-After {r.headers.get('retry-after')}: "
                          f"{r.json()['error']['message']}", flush=True)
                elif r.status_code != 503:
                    print(f"{name}: {r.status_code} at {at:.0f} s: {r.text[:200]}", flush=True)
            time.sleep(2)
    finally:
        http.close()
        if stack.poll() is None:
            os.killpg(stack.pid, signal.SIGINT)
            stack.wait(180)
    return served


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/first-answer"))
    parser.add_argument("--limit-s", type=float, default=3600)
    parser.add_argument("--keep", action="store_true", help="keep the clone (and its .venv) afterwards")
    args = parser.parse_args()
    shutil.rmtree(args.folder, ignore_errors=True)
    args.folder.mkdir(parents=True)
    clone, cache = args.folder / "clone", args.folder / "cache"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"} | {"XDG_CACHE_HOME": str(cache)}
    load = os.getloadavg()[0]
    setup_s = timed(["make", "setup"], clone, env, args.folder / "setup.log")
    print(f"make setup: {setup_s:.0f} s (load average at the start {load:.1f})", flush=True)
    served = first_answers(clone, env, args.folder / "triton.log", args.limit_s)
    subprocess.run(["git", "clean", "-xdfq", "model_repository", ".artifacts", "demo_models"], cwd=clone, check=True)
    model_s = timed(["make", "model"], clone, env, args.folder / "model.log")
    size = subprocess.run(["du", "-sh", str(cache)], capture_output=True, text=True).stdout.split()[0]
    print(f"first 200 after `make triton` started: "
          + ", ".join(f"{name} {served[name]:.0f} s" if name in served else f"{name} never"
                      for name in CALLS), flush=True)
    print(f"a second clone's `make model` with that cache ({size}): {model_s:.0f} s", flush=True)
    if not args.keep:
        shutil.rmtree(args.folder, ignore_errors=True)
    return 0 if len(served) == len(CALLS) else 1


if __name__ == "__main__":
    raise SystemExit(main())
