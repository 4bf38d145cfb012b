"""Kill -> serving again for the codegen pipelines (issue 48): under 64 unary `codegen` clients and 8
`codegen_stream` clients, SIGKILL the generator's stub and time how long until fresh `codegen` and
`codegen_stream` requests succeed 3 times in a row. The generator's own heal is included, and so is the
keeper's restart of a server that Triton 2.51 aborted while the supervisor reloaded the generator
(docs/self-healing.md): either way the figure is what a client sees.

    .venv/bin/python -m bench.generator_heal --kills 5 [--engine torch]

The server runs as `make triton` runs it (supervisor with its canaries, restarted by the keeper), with the
codegen models only. tests/test_codegen_heal_under_load_server.py checks the same with a loose bound."""
from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from bench import stats
from bench.workload import Load
from supervisor.codegen_probe import request_inputs, stream_call
from supervisor.faults import kill_stub

GENERATOR = "codegen_generator"
CODEGEN_MODELS = [GENERATOR, "codegen", "codegen_stream"]
UNARY_CLIENTS, STREAM_CLIENTS = 64, 8
IN_A_ROW = 3
FRESH_TIMEOUT_S = 10.0  # one fresh request's wait: a request the heal left hanging must not hide as slowness


@dataclass
class KillResult:
    killed_at: float
    served_at: float | None  # the first answer of the IN_A_ROW successful rounds in a row
    streak_at: float | None  # the last answer of that streak
    how: str  # "healed" (the supervisor reloaded the generator) or "server restarted" (Triton aborted)
    heal_s: float | None  # the generator's own heal (or the server's restart), from the supervisor's events
    refusals: list  # (time, error) of each fresh round that failed before serving again

    @property
    def serving_s(self) -> float | None:
        return None if self.served_at is None else self.served_at - self.killed_at


def accepted(outcome) -> bool:
    """Answered, or UNAVAILABLE. Over a gRPC stream Triton sends no status code: there the fronts' own
    UNAVAILABLE refusals are told by their words ("... retry", stage_common/errors.Overloaded's)."""
    if outcome.error is None or "UNAVAILABLE" in outcome.error:
        return True
    return outcome.pipeline == "codegen_stream" and outcome.error.startswith("None: ") and "retry" in outcome.error


def fresh_round(url: str) -> None:
    """One fresh `codegen` and one fresh `codegen_stream` request on a new client; raises unless both answer."""
    client = grpcclient.InferenceServerClient(url)
    try:
        client.infer("codegen", request_inputs("def f():", 4), client_timeout=FRESH_TIMEOUT_S)
        stream_call(client, "codegen_stream", request_inputs("def f():", 4), timeout=FRESH_TIMEOUT_S)
    finally:
        client.close()


def serving_again(url: str, limit_s: float, in_a_row: int = IN_A_ROW,
                  refusals: list | None = None) -> tuple[float | None, float | None]:
    """(first answer, last answer) of the first `in_a_row` fresh rounds answered in a row, polling for at most
    `limit_s`; (None, None) if that never happened. `refusals` gets (time, error) of each failed round."""
    deadline = time.time() + limit_s
    streak: list[float] = []
    while time.time() < deadline:
        try:
            fresh_round(url)
        except (InferenceServerException, Exception) as exc:  # noqa: BLE001 - not serving yet: start the streak again
            if refusals is not None:
                refusals.append((time.time(), str(exc)[:160]))
            streak = []
            time.sleep(0.2)
            continue
        streak.append(time.time())
        if len(streak) == in_a_row:
            return streak[0], streak[-1]
    return None, None


def wait_serving(kept, limit_s: float = 180.0) -> None:
    """Until the server `kept` runs (a keeper's restart may be under way) and answers a fresh round."""
    deadline = time.time() + limit_s
    while time.time() < deadline:
        if kept.server.process is not None and serving_again(kept.server.grpc_url, 10.0, in_a_row=1)[0]:
            return
        time.sleep(0.5)
    raise TimeoutError(f"the server did not serve codegen in {limit_s:.0f} s")


def kill_generator(kept, limit_s: float) -> KillResult:
    """SIGKILL the generator's stub of the server `kept` (a SupervisedServer) runs, once it serves; time
    serving again."""
    wait_serving(kept)
    server = kept.server
    restarts_before = len(kept.restarts)
    killed_at = time.time()
    kill_stub(server.process.pid, GENERATOR)
    refusals: list = []
    served_at, streak_at = serving_again(server.grpc_url, limit_s, refusals=refusals)
    healed = next((t for t, e, m in kept.events if e == "healed" and m == GENERATOR and t > killed_at), None)
    restarted = next((r.ready_at for r in kept.restarts[restarts_before:] if r.ready_at), None)
    how, at = ("server restarted", restarted) if restarted else ("healed", healed)
    return KillResult(killed_at, served_at, streak_at, how, None if at is None else at - killed_at, refusals)


def codegen_load(url: str, timeout_s: float = 60.0) -> list[Load]:
    """The issue's load: 64 unary `codegen` clients and 8 `codegen_stream` clients, each in a loop."""
    return [Load(url, ["codegen"], concurrency=UNARY_CLIENTS, timeout_s=timeout_s),
            Load(url, ["codegen_stream"], concurrency=STREAM_CLIENTS, timeout_s=timeout_s)]


def supervised_codegen_server(folder: Path, engine: str | None = None):
    """A SupervisedServer of the codegen models as `make triton` supervises them (canaries included); the
    generator on `engine` (None: the shipped `auto`) through its config on disk, which the heal reads too."""
    from launcher.keeper import RestartPolicy
    from launcher.processes import free_port
    from launcher.server_keeper import SupervisedServer
    from launcher.triton_server import MODEL_REPOSITORY, TritonServer
    from supervisor.state import STATE_FILE_VARIABLE
    from supervisor.canaries import default_canaries
    from supervisor.monitor import Supervisor

    repository = MODEL_REPOSITORY
    if engine is not None:
        from bench.model_repo import repository_with_engine

        repository = repository_with_engine(folder / "models", engine)
    state_file = folder / "supervisor.json"  # as `make triton`, the stubs read it (stage_common/supervisor_view.py)
    server = TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          model_repository=repository, explicit_models=CODEGEN_MODELS,
                          log_file=folder / "tritonserver.log", env={STATE_FILE_VARIABLE: str(state_file)})
    return SupervisedServer(server, lambda s: Supervisor(
        lambda: s.process and s.process.pid, s.grpc_url, state_file,
        canaries=default_canaries(s.grpc_url), canary_period_s=10.0, metrics_url=s.metrics_url),
        RestartPolicy(max_restarts=10, window_s=600))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--engine", choices=["openvino", "torch"], default=None, help="default: the shipped auto")
    parser.add_argument("--limit-s", type=float, default=120.0, help="give up on one kill after this long")
    parser.add_argument("--settle-s", type=float, default=5.0, help="load between serving again and the next kill")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still stops its server
    folder = Path(tempfile.mkdtemp(prefix="generator_heal_"))
    kept = supervised_codegen_server(folder, args.engine).start(timeout=600)
    loads = codegen_load(kept.server.grpc_url)
    results: list[KillResult] = []
    try:
        for load in loads:
            load.start()
        time.sleep(10)  # every client in its loop
        for i in range(args.kills):
            result = kill_generator(kept, args.limit_s)
            results.append(result)
            heal = f"{result.heal_s:.2f}s" if result.heal_s is not None else "-"
            serving = f"{result.serving_s:.2f}s" if result.serving_s is not None else f"NOT in {args.limit_s:.0f}s"
            print(f"kill {i + 1}: kill -> serving {serving} ({result.how} after {heal}); fresh rounds refused "
                  f"{len(result.refusals)}" + "".join(f"\n    +{t - result.killed_at:.2f}s {error}"
                                                     for t, error in result.refusals[-3:]), flush=True)
            time.sleep(args.settle_s)
    finally:
        for load in loads:
            load.stop(grace_s=90)
        kept.stop()
    outcomes = [o for load in loads for o in load.outcomes]
    failed = [o for o in outcomes if o.error is not None]
    served = [r.serving_s for r in results if r.serving_s is not None]
    print(f"\n{len(results)} generator kills under {UNARY_CLIENTS} codegen + {STREAM_CLIENTS} codegen_stream clients "
          f"(engine {args.engine or 'auto'}): kill -> serving " + ", ".join(f"{s:.2f}s" for s in served)
          + (f"; median {stats.median(served):.2f}s, max {max(served):.2f}s" if served else ""))
    refused = [o for o in failed if not accepted(o)]
    print(f"  requests: {len(outcomes)}, failed {len(failed)}, of which not UNAVAILABLE {len(refused)}; "
          f"server restarts {len(kept.restarts)}")
    for o in refused[:5]:
        print(f"    {o.pipeline}: {o.error[:200]}")
    return 0 if len(served) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
