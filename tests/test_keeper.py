"""The one keeper (launcher/keeper.py) and the Service it keeps (launcher/service.py), on short-lived
`python -c` processes instead of servers: restarts with backoff, a process that dies or hangs while
starting, clean exits (ended, or restarted at once outside the crash-loop count), the crash loop, a stop."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from launcher.keeper import DOWN, ENDED, GIVEN_UP, RUNNING, CrashLoop, Keeper, RestartPolicy
from launcher.service import Service

SLEEP = "import time; time.sleep(60)"


class Scripted(Service):
    """Each launch runs the next script; it answers (as a server on its port) while `up` is set, from its
    `up_from`-th launch on."""

    name = "scripted"

    def __init__(self, scripts: list[str], log_file=None, up: bool = True, up_from: int = 1):
        self.scripts, self.log_file, self.up, self.up_from = list(scripts), log_file, up, up_from
        self.launches = self.stops = 0
        self.process = None

    def launch(self):
        self.launches += 1
        self.process = subprocess.Popen([sys.executable, "-c", self.scripts.pop(0)])
        return self.process

    def is_up(self) -> bool:
        return self.up and self.launches >= self.up_from

    def stop(self, timeout=None):
        self.stops += 1
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
        self.process = None


def step_until(keeper: Keeper, predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"keeper stuck in {keeper.state}"
        keeper.step()
        time.sleep(0.02)


@pytest.fixture
def stop_after():
    services = []
    yield services.append
    for service in services:
        service.stop()


def test_an_exit_is_reaped_then_restarted_after_the_backoff(stop_after):
    service = Scripted(["raise SystemExit(2)", SLEEP]).start(timeout=5)
    stop_after(service)
    events = []
    keeper = Keeper(service, RestartPolicy(backoff_s=0.3), on_down=lambda cause: events.append(("down", cause)),
                    on_up=lambda: events.append(("up", service.launches)), say=lambda line: None)
    service.process.wait()
    assert keeper.step() and keeper.state == DOWN and service.stops == 1  # reaped before the backoff
    keeper.step()
    assert keeper.state == DOWN and service.launches == 1  # the backoff is not over
    step_until(keeper, lambda: keeper.state == RUNNING)
    assert events == [("down", "exit code 2"), ("up", 2)]
    restart = keeper.restarts[0]
    assert restart.cause == "exit code 2" and restart.up_at >= restart.died_at + 0.3 and restart.ready_at == restart.up_at
    assert service.process.poll() is None


def test_a_process_that_dies_or_hangs_while_starting_counts_as_a_crash(stop_after):
    service = Scripted([SLEEP, "raise SystemExit(3)", SLEEP, SLEEP]).start(timeout=5)
    stop_after(service)
    # long enough for a python that exits at once to be seen exiting on a loaded box, not as a hang
    keeper = Keeper(service, RestartPolicy(backoff_s=0.01), start_timeout_s=3.0, say=lambda line: None)
    service.up = False  # the next two never answer: the first exits, the second hangs
    service.process.kill()
    step_until(keeper, lambda: len(keeper.restarts) == 3)
    assert [r.cause for r in keeper.restarts] == ["killed by SIGKILL", "died while starting: exit code 3",
                                                  "not ready in time while starting"]
    assert not any(r.up_at for r in keeper.restarts[:2])
    service.up = True
    step_until(keeper, lambda: keeper.state == RUNNING)
    assert keeper.restarts[-1].up_at and service.launches == 4 and service.process.poll() is None


def test_a_clean_exit_ends_the_watch_when_it_is_not_restarted(stop_after):
    service = Scripted(["pass"]).start(timeout=5)
    stop_after(service)
    keeper = Keeper(service, say=lambda line: None)
    keeper.restart_clean_exit = False
    assert keeper.watch() == 0 and keeper.state == ENDED and keeper.restarts == [] and service.launches == 1


def test_clean_exits_restarted_at_once_stay_outside_the_crash_loop(stop_after):
    service = Scripted(["pass"] * 4 + [SLEEP]).start(timeout=5)
    stop_after(service)
    keeper = Keeper(service, RestartPolicy(max_restarts=1, backoff_s=30), say=lambda line: None)
    keeper.clean_exit_counts = False
    step_until(keeper, lambda: service.launches == 5 and keeper.state == RUNNING)
    assert [r.cause for r in keeper.restarts] == ["exit code 0"] * 4 and keeper.failure is None


def test_a_crash_loop_gives_up_naming_the_cause_and_the_log(tmp_path, stop_after):
    log = tmp_path / "scripted.log"
    log.write_text("line one\nthe reason it keeps dying\n")
    service = Scripted(["raise SystemExit(4)"] * 3, log_file=log).start(timeout=5)
    stop_after(service)
    given_up, lines = [], []
    keeper = Keeper(service, RestartPolicy(max_restarts=2, window_s=60, backoff_s=0.01), on_give_up=given_up.append,
                    say=lines.append, name="worker", prefix="test")
    with pytest.raises(CrashLoop) as caught:
        keeper.watch()
    assert keeper.state == GIVEN_UP and service.launches == 3
    assert given_up == [keeper.failure]
    assert keeper.failure.startswith("worker crash loop: 2 restarts within 60s; last exit: ")
    assert str(log) in keeper.failure and "the reason it keeps dying" in str(caught.value)
    assert lines[0] == f"test: worker is down (exit code 4) (log: {log})"
    assert "test: restarting worker in 0.0s" in lines


def test_a_stop_request_is_never_followed_by_a_restart(stop_after):
    service = Scripted([SLEEP, SLEEP]).start(timeout=5)
    stop_after(service)
    keeper = Keeper(service, RestartPolicy(backoff_s=0.01), say=lambda line: None).start_watching()
    keeper.request_stop()
    service.process.kill()
    keeper.join(5)
    time.sleep(0.2)
    assert not keeper.step() and keeper.restarts == [] and service.launches == 1


def test_a_stop_during_the_backoff_leaves_it_down(stop_after):
    service = Scripted([SLEEP, SLEEP]).start(timeout=5)
    stop_after(service)
    keeper = Keeper(service, RestartPolicy(backoff_s=0.5), say=lambda line: None)
    service.process.kill()
    service.process.wait()
    keeper.step()
    keeper.request_stop()
    time.sleep(0.6)
    assert not keeper.step() and keeper.state == DOWN and service.launches == 1


def test_the_first_start_is_kept_like_a_restart(stop_after):
    service = Scripted(["raise SystemExit(5)", SLEEP], up_from=2)
    stop_after(service)
    keeper = Keeper(service, RestartPolicy(backoff_s=0.01), say=lambda line: None)
    keeper.start(timeout=5)
    assert keeper.state == RUNNING and service.launches == 2
    assert keeper.restarts[0].cause.startswith("died while starting: scripted exited with code 5")


def test_at_once_never_waits_and_never_gives_up():
    policy = RestartPolicy.at_once()
    assert {policy.next_delay(t * 0.01) for t in range(2000)} == {0.0}


def test_a_service_waits_until_up_and_says_why_it_did_not_start(tmp_path):
    with Scripted([SLEEP]) as service:  # `with` starts and stops
        assert service.process.poll() is None
    assert service.process is None and service.stops == 1
    dead = Scripted(["raise SystemExit(7)"], log_file=tmp_path / "log", up=False)
    with pytest.raises(RuntimeError, match=r"scripted exited with code 7 \(log: .*log\)"):
        dead.start(timeout=5)
    assert dead.process is None  # stopped on the way out
    silent = Scripted([SLEEP], up=False)
    with pytest.raises(TimeoutError, match="scripted not up after 0s"):
        silent.start(timeout=0.3)
    waiting, stop = Scripted([SLEEP], up=False), threading.Event()
    waiting.launch()
    threading.Timer(0.2, stop.set).start()
    assert waiting.wait_ready(30, stop=stop) is False  # a stop ends the wait, not an error
    waiting.stop()
