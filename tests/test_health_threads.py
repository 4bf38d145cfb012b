"""supervisor/health_threads.py: each stub's health thread is found by what it is (the first thread after the main
one, asleep in nanosleep) and runs SCHED_FIFO, so that Triton 2.51's 1 s health turns never take a starved stub for
dead (the module's docstring says what that did). Real processes stand in for stubs: a child whose second thread
sleeps in a loop, as the stub's health thread does, and whose other threads wait on futexes."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from supervisor.health_threads import HealthThreads, health_thread, prioritize

# the stub's shape: main waits, the first thread after it sleeps 300 ms at a time, a later one waits on a lock
STUB_LIKE = """
import threading, time, sys
def health():
    while True:
        time.sleep(0.3)
h = threading.Thread(target=health, daemon=True); h.start()
time.sleep(0.05)
threading.Thread(target=threading.Event().wait, daemon=True).start()
print(h.native_id, flush=True)
threading.Event().wait()
"""
# no thread asleep in nanosleep first: the first thread after main waits on a futex
NOT_A_STUB = """
import threading, time
threading.Thread(target=threading.Event().wait, daemon=True).start()
time.sleep(0.05)
print(0, flush=True)
threading.Event().wait()
"""


@pytest.fixture
def spawn():
    children = []

    def start(source: str) -> tuple[subprocess.Popen, int]:
        child = subprocess.Popen([sys.executable, "-c", source], stdout=subprocess.PIPE, text=True)
        children.append(child)
        tid = int(child.stdout.readline())
        time.sleep(0.4)  # every thread has reached its wait
        return child, tid

    yield start
    for child in children:
        child.kill()
        child.wait()


def policy(tid: int) -> int:
    return os.sched_getscheduler(tid)


def test_the_health_thread_is_the_first_thread_after_main_asleep_in_nanosleep(spawn):
    child, tid = spawn(STUB_LIKE)
    assert health_thread(child.pid) == tid


def test_a_process_whose_first_thread_does_not_sleep_so_has_none(spawn):
    child, _ = spawn(NOT_A_STUB)
    assert health_thread(child.pid) is None


def test_a_gone_process_has_none():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert health_thread(child.pid) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="SCHED_FIFO needs CAP_SYS_NICE: the refusal is tested below")
def test_the_supervisors_pass_makes_each_health_thread_real_time_once(spawn):
    (first, first_tid), (second, second_tid) = spawn(STUB_LIKE), spawn(STUB_LIKE)
    threads = HealthThreads()
    assert policy(first_tid) == os.SCHED_OTHER
    assert sorted(threads.update([first.pid, second.pid])) == sorted([first_tid, second_tid])
    assert policy(first_tid) == policy(second_tid) == os.SCHED_FIFO
    assert os.sched_getparam(first_tid).sched_priority == 1
    assert threads.update([first.pid, second.pid]) == []  # once per stub
    # the main thread and the others keep their policy
    others = [int(t) for t in os.listdir(f"/proc/{first.pid}/task") if int(t) != first_tid]
    assert {policy(t) for t in others} == {os.SCHED_OTHER}


def test_a_stub_without_its_health_thread_yet_is_tried_again(spawn, monkeypatch):
    child, tid = spawn(STUB_LIKE)
    threads = HealthThreads()
    monkeypatch.setattr("supervisor.health_threads.health_thread", lambda pid: None)
    assert threads.update([child.pid]) == [] and not threads.done
    monkeypatch.setattr("supervisor.health_threads.prioritize", lambda tid: True)
    monkeypatch.setattr("supervisor.health_threads.health_thread", lambda pid: tid)
    assert threads.update([child.pid]) == [tid]


def test_without_the_right_to_set_it_the_supervisor_says_so_once_and_goes_on(spawn, monkeypatch, caplog):
    (first, _), (second, _) = spawn(STUB_LIKE), spawn(STUB_LIKE)

    def refused(tid):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr("supervisor.health_threads.os.sched_setscheduler", lambda *args: refused(args[0]))
    threads = HealthThreads()
    with caplog.at_level("WARNING", logger="supervisor"):
        assert threads.update([first.pid]) == []
        assert threads.update([second.pid]) == []
    assert threads.denied
    assert len([r for r in caplog.records if "real-time priority" in r.getMessage()]) == 1


def test_prioritize_tells_a_refusal_from_success(monkeypatch):
    calls = []
    monkeypatch.setattr("supervisor.health_threads.os.sched_setscheduler", lambda *args: calls.append(args))
    assert prioritize(123) is True and calls[0][0] == 123 and calls[0][1] == os.SCHED_FIFO

    def refused(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr("supervisor.health_threads.os.sched_setscheduler", refused)
    assert prioritize(123) is False
