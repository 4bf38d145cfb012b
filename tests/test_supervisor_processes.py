"""supervisor/processes.py on real processes: alive (a zombie is not), identity across pid reuse, command line,
CPU time, children, trees, groups and the /dev/shm regions a process maps; "gone" is None or empty everywhere."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from supervisor.processes import (alive, command_line, cpu_time, identity, live_children, process_group,
                                  process_tree, shm_regions_mapped, start_time, still_runs)


def python(code: str, *args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, **popen)


@pytest.fixture
def children():
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_process_is_alive_until_it_exits_and_a_zombie_is_not(children):
    process = python("import time; time.sleep(30)")
    children.append(process)
    assert alive(process.pid)
    process.kill()
    assert until(lambda: not alive(process.pid)), "killed, not yet reaped: a zombie is not alive"
    assert psutil.Process(process.pid).status() == psutil.STATUS_ZOMBIE, "the premise: not reaped yet"
    process.wait()
    assert not alive(process.pid) and not alive(None) and not alive(0)


def test_a_pid_and_its_start_time_name_one_process(children):
    first = python("import time; time.sleep(30)")
    children.append(first)
    me = identity(first.pid)
    assert me == (first.pid, start_time(first.pid)) and still_runs(me)
    assert not still_runs((first.pid, me[1] + 1)), "the same pid, started at another time, is another process"
    time.sleep(0.05)
    second = python("import time; time.sleep(30)")
    children.append(second)
    assert start_time(second.pid) > me[1], "a process started later has a later start time"
    first.kill()
    first.wait()
    assert not still_runs(me) and start_time(first.pid) is None and identity(first.pid) is None


def test_command_line_and_cpu_time(children):
    process = python("import sys, time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
                     "print('spun', flush=True); time.sleep(30)")
    children.append(process)
    # after its first line: right after exec, the kernel can show an empty argv for a moment (CI saw ())
    assert process.stdout.readline() == "spun\n"
    assert command_line(process.pid)[:2] == (sys.executable, "-c")
    assert cpu_time(process.pid) >= 0.25
    process.kill()
    process.wait()
    assert command_line(process.pid) is None and cpu_time(process.pid) is None


def test_trees_groups_and_live_children(children):
    # a parent that never waits for its first child (a zombie once it exits) and keeps a second one running
    parent = python("import subprocess, time\nexited = subprocess.Popen(['true'])\n"
                    "running = subprocess.Popen(['sleep', '30'])\n"
                    "print(exited.pid, running.pid, flush=True); time.sleep(30)", start_new_session=True)
    children.append(parent)
    exited, running = map(int, parent.stdout.readline().split())
    assert until(lambda: not alive(exited))
    assert psutil.Process(exited).status() == psutil.STATUS_ZOMBIE, "the premise: exited, never reaped"
    assert live_children(parent.pid) == {running: ("sleep", "30")}, "the zombie child is left out"
    assert process_tree(parent.pid)[0] == parent.pid and running in process_tree(parent.pid)
    assert {parent.pid, running} <= set(process_group(parent.pid)), "its own session: its own group"
    assert parent.pid not in process_group(os.getpgid(0))
    subprocess.run(["kill", "-9", str(running)], check=True)
    assert until(lambda: live_children(parent.pid) == {})
    parent.kill()
    parent.wait()
    assert process_tree(parent.pid) == [] and live_children(parent.pid) == {}


def test_the_shm_regions_a_process_maps(children):
    region = Path(f"/dev/shm/triton_python_backend_shm_region_test-{uuid.uuid4()}")
    other = Path(f"/dev/shm/test-not-a-region-{uuid.uuid4()}")
    for path in (region, other):
        path.write_bytes(b"\0" * 4096)
    try:
        mapper = python("import mmap, sys, time\nfiles = [open(p, 'r+b') for p in sys.argv[1:]]\n"
                        "maps = [mmap.mmap(f.fileno(), 4096) for f in files]\nprint('mapped', flush=True)\n"
                        "time.sleep(30)", str(region), str(other))
        children.append(mapper)
        assert mapper.stdout.readline() == "mapped\n"
        assert shm_regions_mapped([mapper.pid, 999_999_999]) == {str(region)}, "a gone pid is skipped"
        region.unlink()
        assert shm_regions_mapped([mapper.pid]) == set(), "a region already unlinked is skipped"
    finally:
        region.unlink(missing_ok=True)
        other.unlink(missing_ok=True)


def test_tree_regions_reads_maps_again_only_when_the_tree_changes(monkeypatch):
    from supervisor import processes

    reads = []
    monkeypatch.setattr(processes, "shm_regions_mapped", lambda pids: reads.append(list(pids)) or {f"/r{len(reads)}"})
    notes = processes.TreeRegions()
    me = os.getpid()
    assert notes.note([me]) == {"/r1"}
    assert notes.note([me]) == {"/r1"} and len(reads) == 1, "an unchanged tree is not read again"
    with subprocess.Popen(["sleep", "30"]) as child:
        try:
            assert notes.note([me, child.pid]) == {"/r1", "/r2"}, "a new process: read again, regions kept"
        finally:
            child.kill()
    notes.clear()
    assert notes.regions == set() and notes.note([me]) == {"/r3"}
