"""A starved codegen server, with and without the supervisor's real-time health threads (supervisor/health_threads.py).

Triton 2.51 takes a stub whose health thread has not run for 1 s, while a call to it is in flight, for dead: the call
fails "Stub process '...' is not healthy", the stub's IPC queues fall out of step, and the stub soon dies by SIGSEGV
(then the server may abort). This makes that starvation on purpose: the codegen domain's models in a tritonserver
whose session runs at autogroup nice `--nice` (19: the least CPU share), `--hogs` busy processes of ordinary
priority beside it, and `--clients` codegen/codegen_stream clients. Each variant gets a fresh server:

- `plain`: nothing else (what a bare tritonserver does);
- `health-fifo`: the supervisor's pass over the stubs (HealthThreads.update every 0.25 s, as Supervisor.check_once).

Per variant it prints the requests, those that failed "not healthy", and whether the generator's stub or the
server died (and how). The box's other load shifts the odds, not the mechanism: one run each.

    python -m bench.starved_stubs [--seconds 150] [--nice 19] [--hogs 2] [--clients 16]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from bench.workload import Load
from launcher.processes import free_port
from launcher.triton_server import TritonServer
from supervisor.health_threads import HealthThreads
from supervisor.stubs import scan_stub_pids, scan_stubs

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["codegen", "codegen_stream", "codegen_generator", "codegen_collect", "codegen_preprocess",
          "codegen_postprocess"]
GENERATOR = "codegen_generator_0_0"
NOT_HEALTHY = "is not healthy"


def run(variant: str, seconds: float, nice: int, hogs: int, clients: int, log_dir: Path) -> dict:
    server = TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          explicit_models=MODELS, log_file=log_dir / f"tritonserver-{variant}.log", nice=nice)
    server.launch()
    stop = threading.Event()
    busy: list[subprocess.Popen] = []
    try:
        deadline = time.monotonic() + 600
        while not server.is_up():
            if time.monotonic() > deadline or server.process.poll() is not None:
                raise SystemExit(f"{variant}: the server did not come up (log: {server.log_file})")
            time.sleep(0.5)
        if variant == "health-fifo":
            threads = HealthThreads()

            def watch():
                while not stop.is_set():
                    if server.process and server.process.poll() is None:
                        threads.update(scan_stub_pids(server.process.pid))
                    stop.wait(0.25)

            threading.Thread(target=watch, name="health-threads", daemon=True).start()
        time.sleep(2)
        generator = scan_stubs(server.process.pid).get(GENERATOR)
        busy = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, start_new_session=True) for _ in range(hogs)]
        load = Load(server.grpc_url, ["codegen", "codegen_stream"], concurrency=clients, timeout_s=30).start()
        started, died = time.monotonic(), None
        while time.monotonic() - started < seconds and died is None:
            time.sleep(0.5)
            server.note_regions()  # a stub that dies leaves its region: stop() removes the ones noted
            if server.process.poll() is not None:
                died = (time.monotonic() - started, f"server exited {server.process.returncode}")
            elif scan_stubs(server.process.pid).get(GENERATOR) != generator:
                died = (time.monotonic() - started, "generator stub died")
        for process in busy:
            process.kill()
        load.stop(grace_s=40)
    finally:
        stop.set()
        for process in busy:
            process.kill()
        server.stop()
    outcomes = load.outcomes
    errors = Counter((o.error or "")[:100] for o in outcomes if o.error)
    return {"variant": variant, "requests": len(outcomes), "answered": sum(o.error is None for o in outcomes),
            "not_healthy": sum(NOT_HEALTHY in (o.error or "") for o in outcomes),
            "died": f"{died[1]} at {died[0]:.0f}s" if died else "no", "errors": errors.most_common(3)}


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--nice", type=int, default=19)
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--variants", nargs="+", default=["plain", "health-fifo"], choices=["plain", "health-fifo"])
    parser.add_argument("--log-dir", type=Path, default=ROOT / "bench-results" / "starved-stubs")
    args = parser.parse_args()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    print(f"starved_stubs: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {args.seconds:.0f}s per variant, autogroup nice "
          f"{args.nice}, {args.hogs} busy processes, {args.clients} clients")
    for variant in args.variants:
        result = run(variant, args.seconds, args.nice, args.hogs, args.clients, args.log_dir)
        print(f"  {result['variant']}: {result['requests']} requests, {result['answered']} answered, "
              f"{result['not_healthy']} failed 'not healthy', died: {result['died']}; errors {result['errors']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
