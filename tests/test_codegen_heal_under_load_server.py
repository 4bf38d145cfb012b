"""Issue 48 against a live tritonserver, supervised as `make triton` supervises it (canaries included) and
kept by the keeper: under 64 unary `codegen` clients and 8 `codegen_stream` clients, SIGKILL the generator's
stub, five times in a row, on each engine. After every kill: each request in flight ends, answered or with
UNAVAILABLE (none hangs, none gets an internal error); fresh `codegen` and `codegen_stream` requests are
answered 3 times in a row within 30 s of the kill (before: ~72 s when codegen_collect's backend threads all
waited on the dead stub); the supervisor's state (what /health reads) names the generator after the kill and
nothing once it serves again. Triton 2.51 may abort while the generator is reloaded: the keeper's restart is a
heal path too, held to the same bound. The figure to report (kill -> serving on a quiet box) comes from
bench/generator_heal.py, not from here."""
from __future__ import annotations

import threading
import time

import pytest

from bench.generator_heal import accepted, codegen_load, kill_generator, supervised_codegen_server
from codegen_engines import ENGINES
from gateway.supervisor_state import unhealthy_models  # what /health reads

pytestmark = pytest.mark.integration
KILLS = 5
SERVING_LIMIT_S = 30.0  # loose enough for a loaded CI box (the goal, <= 15 s, is measured by the bench)
SETTLE_S = 3.0  # load between serving again and the next kill


@pytest.fixture(scope="module", params=ENGINES)
def kept(tmp_path_factory, request):
    folder = tmp_path_factory.mktemp(f"heal_load_{request.param}")
    supervised = supervised_codegen_server(folder, request.param).start(timeout=300)
    try:
        yield supervised, folder / "supervisor.json"
    finally:
        supervised.stop()


def test_codegen_serves_again_within_30_s_of_each_of_five_generator_kills_under_load(kept):
    supervised, state_file = kept
    loads = codegen_load(supervised.server.grpc_url, timeout_s=60.0)
    states: list[tuple[float, dict]] = []  # (time, the supervisor's unhealthy models), sampled throughout
    sampling = threading.Event()

    def sample():
        while not sampling.is_set():
            states.append((time.time(), unhealthy_models(state_file)))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    results = []
    try:
        for load in loads:
            load.start()
        deadline = time.time() + 120  # every client in its loop: each answered at least once
        while sum(o.error is None for load in loads for o in load.outcomes) < 72 and time.time() < deadline:
            time.sleep(0.2)
        sampler.start()
        for _ in range(KILLS):
            restarts_before = len(supervised.restarts)
            result = kill_generator(supervised, SERVING_LIMIT_S)
            results.append((result, len(supervised.restarts) > restarts_before))
            assert result.streak_at is not None, (
                f"kill {len(results)}: not 3 answers in a row within {SERVING_LIMIT_S:.0f} s ({result.how}); "
                f"events {supervised.events[-6:]}")
            time.sleep(SETTLE_S)
    finally:
        for load in loads:
            load.stop(grace_s=90)  # a request still unanswered then is recorded as hung
        sampling.set()
    print("\nkill -> serving: " + ", ".join(f"{r.serving_s:.1f}s ({r.how})" for r, _ in results))
    outcomes = [o for load in loads for o in load.outcomes]
    refused = [o for o in outcomes if not accepted(o)]
    assert not refused, [(o.pipeline, o.error[:160]) for o in refused[:5]]
    for result, restarted in results:
        assert result.streak_at - result.killed_at <= SERVING_LIMIT_S
        assert [o for o in outcomes if o.start > result.streak_at and o.error is None], "the load is served again"
        named = [t for t, unhealthy in states if result.killed_at <= t <= result.served_at
                 and "codegen_generator" in unhealthy]
        # a restarted server's new supervisor starts with nothing to report (the gateway reports Triton down)
        assert named or restarted, f"the state never named the killed generator ({result.how})"
        calm = [unhealthy for t, unhealthy in states if result.streak_at + 1.0 <= t <= result.streak_at + SETTLE_S]
        assert calm and not any(calm), f"models still reported down after serving again: {calm[-1]}"
