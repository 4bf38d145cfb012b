"""bench/load.py, the closed loop every bench drives: counts, the duration's stop, the warm-up kept out of the
measured records, and each failed request recorded with its error while the load goes on."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from bench import load


def test_a_count_starts_that_many_requests_spread_over_the_clients():
    seen = []

    def request(call: load.Call) -> int:
        seen.append(call)
        time.sleep(0.005)
        return call.index * 10

    run = load.run_threads(request, 3, count=7)
    assert sorted(r.index for r in run.every) == list(range(7)) and len(seen) == 7
    assert {r.worker for r in run.every} == {0, 1, 2}
    assert all(r.value == r.index * 10 and r.ok and r.end >= r.start for r in run.every)
    # each client's turns count its own requests, from 0
    for worker in range(3):
        assert sorted(r.turn for r in run.every if r.worker == worker) == list(range(sum(r.worker == worker
                                                                                      for r in run.every)))
    assert run.records == run.every  # no duration: the window is the whole run


def test_an_async_count_and_concurrency():
    in_flight, most = 0, 0

    async def request(call: load.Call) -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1

    run = asyncio.run(load.run_async(request, 4, count=10))
    assert len(run.every) == 10 and most == 4


@pytest.mark.parametrize("kind", ["async", "threads"])
def test_the_duration_stops_new_requests_and_the_warmup_is_not_measured(kind):
    async def async_request(call):
        await asyncio.sleep(0.02)

    def request(call):
        time.sleep(0.02)

    options = dict(duration=0.3, warmup=0.2)
    run = asyncio.run(load.run_async(async_request, 2, **options)) if kind == "async" else \
        load.run_threads(request, 2, **options)
    assert run.window_from == pytest.approx(run.started + 0.2) and run.seconds == pytest.approx(0.3)
    assert all(r.start < run.window_to for r in run.every)  # none started after the duration
    assert run.ended - run.started < 0.5 + 0.1  # the last requests end one request after the duration
    warm = [r for r in run.every if r.end < run.window_from]
    assert warm and len(warm) < len(run.every)
    assert all(run.window_from <= r.end <= run.window_to for r in run.records)
    assert not set(map(id, warm)) & set(map(id, run.records))  # the warm-up's requests are not measured
    assert 15 <= len(run.records) <= 33  # 2 clients x 0.3 s / 0.02 s, on a busy box
    assert len(run.latencies) == len(run.records) and all(0.015 < t < 0.5 for t in run.latencies)


def test_each_failure_is_recorded_with_its_error_and_the_load_goes_on():
    def request(call: load.Call) -> str:
        if call.index % 3 == 1:
            raise ValueError(f"odd {call.index}")
        if call.index % 3 == 2:
            raise load.Failed(f"HTTP 429: request {call.index}")
        return "fine"

    run = load.run_threads(request, 2, count=9)
    by_index = {r.index: r for r in run.every}
    assert len(by_index) == 9
    assert [by_index[i].error for i in (1, 4, 7)] == ["ValueError: odd 1", "ValueError: odd 4", "ValueError: odd 7"]
    assert [by_index[i].error for i in (2, 5)] == ["HTTP 429: request 2", "HTTP 429: request 5"]  # as it is
    assert all(by_index[i].ok and by_index[i].value == "fine" for i in (0, 3, 6))
    assert all(by_index[i].value is None and not by_index[i].ok for i in (1, 2))
    assert run.errors == 6 and len(run.latencies) == 3 and run.first_error in {r.error for r in run.every if not r.ok}
    custom = load.run_threads(request, 1, count=2, describe_error=lambda e: "custom")
    assert [r.error for r in custom.every] == [None, "custom"]


def test_a_background_load_stops_and_names_a_client_stuck_in_a_request():
    release = threading.Event()
    noted = []

    def request(call: load.Call) -> None:
        if call.worker == 1 and call.turn == 2:
            release.wait(5)  # hangs until the test lets it go
        else:
            time.sleep(0.002)

    background = load.Background(request, 2, on_record=noted.append).start()
    time.sleep(0.2)
    assert background.stop(grace_s=0.2) == [1]
    release.set()
    assert background.join(2) == []
    assert noted == background.run.every and any(r.worker == 0 for r in noted)
    count = len(background.run.every)
    time.sleep(0.05)
    assert len(background.run.every) == count  # stopped: no new request


def test_a_client_pauses_after_a_failure_when_asked():
    def request(call: load.Call) -> None:
        raise RuntimeError("down")

    quick = load.run_threads(request, 1, duration=0.2)
    paused = load.run_threads(request, 1, duration=0.2, pause_after_error=lambda record: 0.05)
    assert len(paused.every) <= 5 < len(quick.every)


def test_a_load_result_counts_the_window_only():
    run = load.Run(started=0.0, window_from=1.0, window_to=3.0, every=[
        load.Record(0, 0, 0, 0.0, 0.5), load.Record(1, 0, 1, 0.5, 1.5), load.Record(2, 0, 2, 1.5, 2.0, "boom"),
        load.Record(3, 0, 3, 2.0, 2.5), load.Record(4, 0, 4, 2.5, 3.5)])
    result = load.LoadResult.of("m", 1, run, rows_per_request=4)
    assert result.latencies == [1.0, 0.5] and result.errors == 1 and result.first_error == "boom"
    assert result.throughput == 2 * 4 / 2.0 and result.percentile(50) == 0.75


def test_a_loop_without_a_stop_rule_is_refused():
    with pytest.raises(ValueError):
        load.run_threads(lambda call: None, 1)
    with pytest.raises(ValueError):
        asyncio.run(load.run_async(lambda call: None, 1))
