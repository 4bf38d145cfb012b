"""The soak's schedule and its accounting of outcomes (the run itself is `make soak`)."""
from __future__ import annotations

from bench import soak
from bench.workload import Outcome


def test_kills_every_5_minutes_scaled_down_so_a_120s_run_has_one():
    assert len(soak.kill_times(120, 18, 300)) >= 1
    assert all(18 < t < 110 for t in soak.kill_times(120, 18, 300))
    long_run = soak.kill_times(1800, 120, 300)
    assert len(long_run) == 5 and long_run[0] == 420 and long_run[1] - long_run[0] == 300


def test_bad_requests_count_as_expected_only_when_refused_as_invalid():
    assert Outcome("ner", 0, 1, False, None).expected
    assert not Outcome("ner", 0, 1, False, "StatusCode.INTERNAL: boom").expected
    assert Outcome("ner", 0, 1, True, "StatusCode.INVALID_ARGUMENT: unexpected datatype").expected
    assert not Outcome("ner", 0, 1, True, None).expected  # a bad request that was answered
    assert not Outcome("ner", 0, 1, True, "StatusCode.INTERNAL: Stub process is not healthy").expected
    stream = "temperature must be"  # a gRPC stream's error carries no status code, only the message
    assert Outcome("codegen_stream", 0, 1, True, "None: temperature must be >= 0 and finite", stream).expected
    assert not Outcome("codegen_stream", 0, 1, True, "None: Stub process is not healthy", stream).expected


def test_processes_that_are_gone_or_zombies_are_not_left_behind():
    assert soak.alive_after({999_999_999}, 0.1) == []
    import os

    assert soak.alive_after({os.getpid()}, 0.1) == [os.getpid()]


def test_the_plan_kills_the_server_too_and_every_stub_kind_in_a_long_run():
    short = soak.kill_plan(120, 18, 300, soak.KILL_TARGETS, 1)
    assert [target for _, target in short] == [soak.SERVER, soak.KILL_TARGETS[0]]
    assert all(18 < t < 110 for t, _ in short)
    long_run = soak.kill_plan(1800, 120, 300, soak.KILL_TARGETS, 2)
    targets = [target for _, target in long_run]
    assert targets.count(soak.SERVER) == 2 and "codegen_generator" in targets and len(targets) == 7
    assert targets[0] != soak.SERVER and targets[-1] != soak.SERVER  # spread among the stub kills
    assert all(120 < t < 1790 for t, _ in long_run)
