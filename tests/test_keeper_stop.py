"""Stop means stop (launcher/keeper.py): a keeper starts nothing once a stop has been requested, whatever the
order in which a death and the stop arrive, and `kill_all` leaves nothing it ever started running. Each race is
played deterministically: the service's hooks (events) hold the keeper at the moment the stop arrives, never a
sleep that hopes to land there."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from launcher.keeper import DOWN, RUNNING, STARTING, Keeper, RestartPolicy
from launcher.service import Service
from supervisor.processes import alive, process_group, still_alive

SLEEP = "import time; time.sleep(60)"
# a process that starts a child of its own (in its process group, as tritonserver starts its stubs)
WITH_CHILD = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"


class Hooked(Service):
    """Runs `script` in a session of its own at each launch; `before_spawn(n)` runs inside the launch of the n-th
    process, before it is spawned (where a test holds the keeper or requests the stop)."""

    name = "hooked"
    poll_s = 0.02

    def __init__(self, script: str = SLEEP, before_spawn=None):
        self.script, self.before_spawn = script, before_spawn
        self.launches, self.pids, self.process = 0, [], None

    def launch(self):
        self.launches += 1
        if self.before_spawn:
            self.before_spawn(self.launches)
        self.process = subprocess.Popen([sys.executable, "-c", self.script], start_new_session=True)
        self.pids.append(self.process.pid)

    def is_up(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout=None):
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
        self.process = None


@pytest.fixture
def keepers():
    made = []
    yield made.append
    for keeper in made:
        keeper.stop()


def quiet(service, **options) -> Keeper:
    return Keeper(service, RestartPolicy(backoff_s=0.0), say=lambda line: None, **options)


def kill_and_reap(service) -> None:
    service.process.kill()
    service.process.wait()


def test_a_stop_while_a_restart_spawns_on_another_thread_waits_for_it_then_it_is_stopped(keepers):
    entered, release = threading.Event(), threading.Event()

    def hold_the_second(n):
        if n == 2:
            entered.set()
            assert release.wait(30)

    service = Hooked(before_spawn=hold_the_second)
    keeper = quiet(service)
    keepers(keeper)
    keeper.start(timeout=10)
    keeper.start_watching()
    kill_and_reap(service)
    assert entered.wait(30), "no restart began"
    stopper = threading.Thread(target=keeper.request_stop)
    stopper.start()
    stopper.join(0.3)
    assert stopper.is_alive(), "request_stop returned while a spawn was under way"
    release.set()
    stopper.join(30)
    assert not stopper.is_alive()
    keeper.join(30)
    # the process spawned before the stop was through is stopped by the keeper, and nothing else starts
    assert service.launches == 2 and not alive(service.pids[1]) and keeper.state != STARTING
    assert not keeper.step() and service.launches == 2


def test_a_stop_from_a_signal_handler_on_the_spawning_thread_stops_what_it_spawned(keepers):
    service = Hooked()
    keeper = quiet(service)
    keepers(keeper)
    keeper.start(timeout=10)
    service.before_spawn = lambda n: keeper.request_stop()  # the handler runs between the check and the spawn
    kill_and_reap(service)
    keeper.step()  # the death: down, restart due at once
    keeper.step()  # the restart, interrupted by the stop
    assert service.launches == 2 and not alive(service.pids[1]) and service.process is None
    assert not keeper.step() and service.launches == 2 and keeper.state != RUNNING


def test_a_stop_that_comes_with_the_death_is_never_followed_by_a_start(keepers):
    lines = []
    service = Hooked()
    keeper = Keeper(service, RestartPolicy(backoff_s=0.0), say=lines.append,
                    on_down=lambda cause: keeper.request_stop())
    keepers(keeper)
    keeper.start(timeout=10)
    kill_and_reap(service)
    assert keeper.step() and keeper.state == DOWN  # the death is seen, the stop arrives before the backoff is set
    assert not keeper.step() and not keeper.step() and service.launches == 1
    assert lines[-1] == "launcher: process not restarted: stopping"


def test_a_stop_before_the_death_is_never_followed_by_a_start(keepers):
    service = Hooked()
    keeper = quiet(service)
    keepers(keeper)
    keeper.start(timeout=10)
    keeper.request_stop()
    kill_and_reap(service)
    assert not keeper.step() and keeper.restarts == [] and service.launches == 1


def test_a_first_start_after_a_stop_starts_nothing():
    service = Hooked()
    keeper = quiet(service)
    keeper.request_stop()
    keeper.start(timeout=10)
    assert service.launches == 0 and service.process is None and keeper.started == []


def test_kill_all_kills_every_process_it_started_and_their_groups():
    service = Hooked(WITH_CHILD)
    keeper = quiet(service)
    keeper.start(timeout=10)
    first = service.process
    wait, deadline = threading.Event(), time.monotonic() + 30
    while len(process_group(first.pid)) < 2 and time.monotonic() < deadline:  # the child is started
        wait.wait(0.05)
    members = process_group(first.pid)
    service.process = None  # as if a stop path had lost track of it: kill_all still knows it by its identity
    keeper.kill_all()
    first.wait(10)
    assert len(members) == 2 and still_alive(members, timeout=10) == []


def test_what_a_keeper_started_does_not_outlive_the_process_that_kept_it(tmp_path):
    """A launcher that exits on any path but SIGKILL (an exception, a stop path that lost track of a process, a
    second signal) leaves no orphan: the keeper's atexit kills what any keeper started and still runs."""
    script = f"""
import subprocess, sys
from launcher.keeper import Keeper
from launcher.service import Service

class Orphaned(Service):
    process = None
    def launch(self):
        self.process = subprocess.Popen([sys.executable, "-c", {WITH_CHILD!r}], start_new_session=True)
    def is_up(self):
        return True
    def stop(self, timeout=None):
        pass  # a stop path that leaves it running

keeper = Keeper(Orphaned())
keeper.start(timeout=10)
print(keeper.process.pid, flush=True)
raise SystemExit("the launcher ends without stopping it")
"""
    out = tmp_path / "out"
    with out.open("w") as output:  # a file, not a pipe: an orphan holding a pipe would keep run() waiting
        done = subprocess.run([sys.executable, "-c", script], stdout=output, stderr=subprocess.DEVNULL, timeout=60)
    pid = int(out.read_text().split()[0])
    assert done.returncode == 1 and still_alive([pid], timeout=10) == [] and still_alive(process_group(pid), 10) == []
