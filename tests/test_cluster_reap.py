"""What a cluster knows of a replica's processes by identity (pid and start time): a launcher killed with SIGKILL
leaves its children running, `reap` kills those and removes the /dev/shm regions they mapped, and never a process
that only reuses a pid; `cluster.json`'s owner is alive only while that very process runs."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from launcher.cluster.replicas import Replica, reap
from launcher.cluster.state import owner_alive, read_state, write_state
from supervisor.processes import alive, start_time

# a launcher that leaves a child in a session of its own (as tritonserver and the gateway are), which maps a region
LAUNCHER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import mmap, sys, time; f = open(sys.argv[1], 'r+b'); "
                          "m = mmap.mmap(f.fileno(), 4096); print('mapped', flush=True); time.sleep(60)", sys.argv[1]],
                         start_new_session=True, stdout=subprocess.PIPE, text=True)
print(child.pid, child.stdout.readline().strip(), flush=True)
time.sleep(60)
"""


def test_reap_kills_what_a_killed_launcher_left_and_removes_its_regions(tmp_path):
    region = Path(f"/dev/shm/triton_python_backend_shm_region_test-{uuid.uuid4()}")
    region.write_bytes(b"\0" * 4096)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(region)], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child_pid, mapped = launcher.stdout.readline().split()
        child = int(child_pid)
        assert mapped == "mapped"
        replica = Replica(0, 1, 2, 3, 4, tmp_path)
        replica.process = launcher
        replica.note()
        assert set(replica.seen) == {launcher.pid, child} and replica.mapped.regions == {str(region)}
        # a pid whose process is not the one noted (its start time differs): a reused pid, never killed
        replica.seen[bystander.pid] = start_time(bystander.pid) - 1
        launcher.kill()
        launcher.wait()
        assert alive(child), "the premise: the launcher's child outlives it"
        assert reap(replica) == 1
        assert not alive(child) and not region.exists()
        assert alive(bystander.pid), "a process that only shares a noted pid was killed"
        assert replica.seen == {} and replica.mapped.regions == set()
    finally:
        for process in (launcher, bystander):
            process.kill()
            process.wait()
        if child is not None and alive(child):
            os.kill(child, 9)
        region.unlink(missing_ok=True)


def test_the_state_files_owner_is_alive_only_while_that_process_runs(tmp_path):
    me = {"pid": os.getpid(), "pid_start": start_time(os.getpid())}
    write_state(tmp_path, me)
    assert owner_alive(read_state(tmp_path)), "the start time survives the JSON round trip"
    assert not owner_alive({**me, "pid_start": me["pid_start"] + 0.01}), "another process with this pid"
    gone = subprocess.Popen(["true"])
    gone.wait()
    time.sleep(0.01)
    assert not owner_alive({"pid": gone.pid, "pid_start": 0.0}) and not owner_alive({})
