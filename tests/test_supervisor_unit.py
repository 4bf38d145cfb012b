"""The supervisor's detection logic on a fake process table (psutil's), ensembles lookup and exposure settings."""
from __future__ import annotations

import contextlib
import time
from pathlib import Path

import psutil
import pytest

from gateway.loopback import is_loopback
from launcher.exposure import admin_key, restricted_api_args, restriction_required
from supervisor.monitor import ensembles_using
from supervisor.stubs import StubTracker, instance_of, model_of, scan_stubs

STUB = "/work/main/backends/python/triton_python_backend_stub"


class FakeProcesses:
    """A process table at the psutil seam: psutil.Process(pid) answers from it while the test runs."""

    BOOT = 1_700_000_000.0

    def __init__(self, monkeypatch):
        self.table: dict[int, dict] = {}
        monkeypatch.setattr(psutil, "Process", self.process)
        monkeypatch.setattr(psutil, "boot_time", lambda: self.BOOT)

    def add(self, pid: int, ppid: int, argv: list[str], status: str = psutil.STATUS_SLEEPING,
            started: float | None = None) -> None:
        """`started`: seconds after boot (default: the pid, i.e. started in pid order)."""
        self.table[pid] = {"ppid": ppid, "argv": argv, "status": status, "started": pid if started is None else started}

    def process(self, pid: int) -> FakeProcess:
        if pid not in self.table:
            raise psutil.NoSuchProcess(pid)
        return FakeProcess(self, pid)


class FakeProcess:
    def __init__(self, processes: FakeProcesses, pid: int):
        self.processes, self.pid = processes, pid

    def _row(self) -> dict:
        if self.pid not in self.processes.table:
            raise psutil.NoSuchProcess(self.pid)
        return self.processes.table[self.pid]

    def oneshot(self):
        return contextlib.nullcontext()

    def children(self) -> list[FakeProcess]:
        self._row()
        return [FakeProcess(self.processes, pid) for pid, row in self.processes.table.items()
                if row["ppid"] == self.pid]

    def status(self) -> str:
        return self._row()["status"]

    def cmdline(self) -> list[str]:
        return list(self._row()["argv"])

    def create_time(self) -> float:
        return FakeProcesses.BOOT + self._row()["started"]


def stub_argv(model: str, instance: str) -> list[str]:
    return [STUB, f"/repo/{model}/1/model.py", "triton_python_backend_shm_region_1f2e-33aa", "1048576", "1048576",
            "100", "/work/main/backends/python", "336", instance, "/work/main/backends/x"]


def test_instance_and_model_names_come_from_the_stub_command_line():
    assert instance_of(tuple(stub_argv("text_embedding_encoder", "text_embedding_encoder_0_1"))) == \
        "text_embedding_encoder_0_1"
    assert instance_of(("/usr/bin/python3", "x_0_0")) is None
    assert model_of("codegen_generator_0_0") == "codegen_generator"


def test_scan_finds_live_stubs_of_this_server_only(monkeypatch):
    processes = FakeProcesses(monkeypatch)
    processes.add(100, 1, ["tritonserver", "--model-repository=/repo"])
    processes.add(101, 100, stub_argv("ner_decoder", "ner_decoder_0_0"))
    processes.add(102, 100, stub_argv("ner_tagger", "ner_tagger_0_0"))
    processes.add(103, 100, [], status=psutil.STATUS_ZOMBIE)  # a zombie: its command line is gone
    # a zombie whose command line is still read is no live stub either
    processes.add(104, 100, stub_argv("ner_tagger", "ner_tagger_0_1"), status=psutil.STATUS_ZOMBIE)
    processes.add(105, 100, ["/usr/bin/python3", "helper_0_0"])  # not a stub
    processes.add(201, 200, stub_argv("ner_decoder", "ner_decoder_0_0"))  # another server's stub
    assert scan_stubs(100) == {"ner_decoder_0_0": 101, "ner_tagger_0_0": 102}
    assert scan_stubs(999) == {}, "a server gone has no stubs"


def by_pid(instances: dict[str, int]) -> dict[int, str]:
    """A scan (pid -> instance) from instance -> pid."""
    return {pid: instance for instance, pid in instances.items()}


def in_pid_order(pid: int) -> int:
    return pid  # fake start times: each pid started after the lower ones


def test_a_vanished_or_zombie_stub_is_a_death_after_two_scans(tmp_path):
    tracker = StubTracker(confirm=2)
    ready = {"ner", "ner_decoder", "ner_tagger"}
    assert tracker.update(by_pid({"ner_decoder_0_0": 101, "ner_tagger_0_0": 102}), ready, in_pid_order) == {}
    assert tracker.update(by_pid({"ner_tagger_0_0": 102}), ready, in_pid_order) == {}  # could be a reload's window
    deaths = tracker.update(by_pid({"ner_tagger_0_0": 102}), ready, in_pid_order)
    assert list(deaths) == ["ner_decoder"] and "101" in deaths["ner_decoder"]


def test_a_stub_replaced_by_a_reload_is_not_a_death():
    tracker = StubTracker()
    ready = {"m"}
    tracker.update({10: "m_0_0"}, ready, in_pid_order)
    assert tracker.update({11: "m_0_0"}, ready, in_pid_order) == {}
    assert tracker.update({11: "m_0_0"}, ready, in_pid_order) == {}


def test_an_unloaded_model_is_not_a_death():
    tracker = StubTracker()
    tracker.update({10: "m_0_0", 12: "k_0_0"}, {"m", "k"}, in_pid_order)
    assert tracker.update({12: "k_0_0"}, {"k"}, in_pid_order) == {}  # the gateway unloaded m
    assert tracker.update({12: "k_0_0"}, {"k"}, in_pid_order) == {}
    assert tracker.update({12: "k_0_0"}, {"k", "m"}, in_pid_order) == {}  # loaded again: re-learnt from its stubs


def test_a_stub_that_dies_right_after_its_heal_is_a_new_death():
    tracker = StubTracker(confirm=1)
    tracker.update({10: "m_0_0"}, {"m"}, in_pid_order)
    assert tracker.update({}, {"m"}, in_pid_order) == {"m": "stub process 10 of 'm_0_0' died"}
    tracker.healed("m")  # the reload's stub 20 was killed before any scan saw it
    assert tracker.update({}, {"m"}, in_pid_order) == {"m": "stub process 10 of 'm_0_0' died"}
    tracker.healed("m")
    assert tracker.update({30: "m_0_0"}, {"m"}, in_pid_order) == {}
    assert tracker.known == {"m_0_0": (30, 30)}


def test_the_death_of_the_newest_stub_is_seen_while_an_older_one_carries_the_name():
    """Issue 35, item 2: an old version's stub kept alive by a request in flight, and the new one. Killing the
    new one went unseen because *some* stub still had the name; and after a pid wrap the new stub has the lower
    pid. The tracker follows the stub that started last, by its (pid, start time)."""
    starts = {30000: 100, 250: 900}  # the new stub (pid 250, after a wrap-around) started after pid 30000
    tracker = StubTracker(confirm=2)
    ready = {"codegen_collect"}
    both = {30000: "codegen_collect_0_0", 250: "codegen_collect_0_0"}
    assert tracker.update(both, ready, starts.get) == {}
    assert tracker.known == {"codegen_collect_0_0": (250, 900)}, "not the higher pid: the later start"
    old_only = {30000: "codegen_collect_0_0"}  # kill -9 of the new stub
    assert tracker.update(old_only, ready, starts.get) == {}
    assert tracker.update(old_only, ready, starts.get) == {"codegen_collect": "stub process 250 of "
                                                                              "'codegen_collect_0_0' died"}
    # a pid reused by an unrelated later process is not the stub that died
    starts[250] = 5000
    assert "codegen_collect" in tracker.update({30000: "codegen_collect_0_0"}, ready, starts.get)
    tracker.healed("codegen_collect")
    starts[260] = 6000  # the heal's stub
    assert tracker.update({30000: "codegen_collect_0_0", 260: "codegen_collect_0_0"}, ready, starts.get) == {}
    assert tracker.known == {"codegen_collect_0_0": (260, 6000)}


def test_an_instance_the_loaded_configuration_dropped_is_not_a_death():
    """Issue 35, item 4: lowering an instance count ends that instance's stub with the old version; the expected
    set follows the loaded configuration, so it is forgotten, not healed (which reloaded it every ~5 s)."""
    from supervisor.stubs import expected_instances

    config = {"instance_group": [{"kind": "KIND_CPU", "count": 1}]}
    assert expected_instances("enc", config) == {"enc_0_0"}
    assert expected_instances("enc", {"instance_group": [{"count": 2}, {"name": "g", "count": 1}]}) == \
        {"enc_0_0", "enc_0_1", "g_0"}
    assert expected_instances("ens", {"ensemble_scheduling": {}}) is None
    tracker = StubTracker(confirm=2)
    ready, asked = {"enc"}, []

    def expected(model):
        asked.append(model)
        return expected_instances(model, config)

    tracker.update({10: "enc_0_0", 11: "enc_0_1"}, ready, in_pid_order, expected)
    for _ in range(5):  # reloaded with count 1: a new enc_0_0, and enc_0_1's stub ended
        assert tracker.update({12: "enc_0_0"}, ready, in_pid_order, expected) == {}
    assert tracker.known == {"enc_0_0": (12, 12)} and asked == ["enc"], "asked once, at the death it prevented"
    # a real death of an instance the configuration has is still one
    assert tracker.update({}, ready, in_pid_order, expected) == {}
    assert tracker.update({}, ready, in_pid_order, expected) == {"enc": "stub process 12 of 'enc_0_0' died"}


def test_ensembles_and_bls_pipelines_using_a_model_are_found_transitively():
    configs = {
        "enc": {}, "tok": {},
        "emb": {"ensemble_scheduling": {"step": [{"model_name": "tok"}, {"model_name": "enc"}]}},
        "outer": {"ensemble_scheduling": {"step": [{"model_name": "emb"}]}},
        "other": {"ensemble_scheduling": {"step": [{"model_name": "tok"}]}},
        "bls": {"parameters": {"encoder_model": {"string_value": "enc"}, "n": {"string_value": "3"}}},
    }
    assert ensembles_using(configs, "enc") == {"emb", "outer", "bls"}
    assert ensembles_using(configs, "outer") == set()


def test_restriction_applies_off_loopback_or_when_forced(tmp_path):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback("10.1.2.3")
    assert not restriction_required("127.0.0.1", {})
    assert restriction_required("0.0.0.0", {})
    assert restriction_required("127.0.0.1", {"TRITON_RESTRICT_API": "1"})
    key, generated = admin_key(tmp_path / "key", {})
    assert generated and len(key) > 30 and (tmp_path / "key").stat().st_mode & 0o077 == 0
    assert admin_key(tmp_path / "key", {}) == (key, True)  # kept across restarts
    assert admin_key(tmp_path / "key", {"TRITON_ADMIN_KEY": "k"}) == ("k", False)
    assert restricted_api_args() == [  # the key itself never (tests/test_abuse3_admin_key.py)
        "--grpc-restricted-protocol=model-repository,shared-memory:triton-admin-key=@TRITON_ADMIN_KEY@",
        "--http-restricted-api=model-repository,shared-memory:triton-admin-key=@TRITON_ADMIN_KEY@"]


class FakeTriton:
    """The few tritonclient calls the supervisor makes."""

    def __init__(self, fail_loads: int = 0):
        self.configs = {
            "enc": {"name": "enc", "max_batch_size": 8},
            "emb": {"name": "emb", "ensemble_scheduling": {"step": [{"model_name": "enc"}]}},
        }
        self.loads: list[tuple] = []
        self.fail_loads = fail_loads
        self.not_ready: set[str] = set()

    def get_model_repository_index(self, as_json, headers=None):
        return {"models": [{"name": n, "state": "UNAVAILABLE" if n in self.not_ready else "READY"}
                           for n in self.configs]}

    def get_model_config(self, model, as_json):
        return {"config": self.configs[model]}

    def load_model(self, model, config=None, headers=None):
        self.loads.append((model, config, headers))
        if self.fail_loads:
            self.fail_loads -= 1
            raise RuntimeError("load failed")

    def close(self):
        pass


def test_heal_reports_the_model_and_its_ensembles_then_reloads_with_a_config_override(tmp_path):
    import json

    from supervisor.monitor import Supervisor
    from gateway.supervisor_state import unhealthy_models  # what /health reads

    fake, state = FakeTriton(fail_loads=1), tmp_path / "run" / "state.json"
    seen = []
    fake.load_model = (lambda original: lambda *a, **k: (seen.append(unhealthy_models(state)), original(*a, **k)))(
        fake.load_model)
    supervisor = Supervisor(1, "unused", state, admin_key="k", client=fake)
    assert unhealthy_models(state) == {}
    assert not supervisor.heal("enc", "stub died", {"enc", "emb"})  # the first reload fails: still unhealthy
    assert set(unhealthy_models(state)) == {"enc", "emb"} and "enc" in unhealthy_models(state)["emb"]
    assert supervisor.heal("enc", "stub died", {"enc", "emb"})
    assert set(seen[0]) == {"enc", "emb"}  # health said 503 while the reload ran
    assert unhealthy_models(state) == {}
    model, config, headers = fake.loads[-1]
    override = json.loads(config)
    marker = override.pop("parameters")["supervisor_reload"]["string_value"]
    assert model == "enc" and override == fake.configs["enc"]
    # each heal's override differs, or Triton would skip the second reload of the same model
    assert marker != json.loads(fake.loads[-2][1])["parameters"]["supervisor_reload"]["string_value"]
    assert headers == {"triton-grpc-protocol-triton-admin-key": "k"}
    assert [e for _, e, _ in supervisor.events] == ["death detected", "reload started", "reload failed",
                                                    "death detected", "reload started", "healed"]


def wait_for(condition, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def canary_supervisor(tmp_path, monkeypatch, canaries, **kwargs):
    from supervisor import monitor
    from supervisor.monitor import Supervisor

    stubs = {5: "enc_0_0"}
    monkeypatch.setattr(monitor, "scan_stub_pids", lambda pid: dict(stubs))
    fake = FakeTriton()
    load = fake.load_model
    # each reload starts a new stub; the hung one lives on (an orphan, retired once idle)
    fake.load_model = lambda *a, **k: (load(*a, **k), stubs.update({max(stubs) + 1: "enc_0_0"}))
    supervisor = Supervisor(1, "unused", tmp_path / "s.json", client=fake, canaries=canaries, **kwargs)
    supervisor.started = in_pid_order
    return fake, supervisor


def healed(supervisor, model="enc") -> bool:
    return any(e == "healed" and m == model for _, e, m in supervisor.events)


def test_a_failing_canary_reloads_its_model(tmp_path, monkeypatch):
    calls = []

    def hung():
        calls.append(1)
        raise TimeoutError("no answer in 10 s")

    fake, supervisor = canary_supervisor(tmp_path, monkeypatch, {"enc": hung}, canary_period_s=0)
    supervisor.check_once()
    assert calls == []  # the scan runs no canary: its own thread does
    supervisor.check_canaries_once()
    supervisor.check_canaries_once()
    assert wait_for(lambda: healed(supervisor))  # heals run in their own thread
    assert [m for m, _, _ in fake.loads] == ["enc"]
    assert any(e == "hang detected" and m == "enc" for _, e, m in supervisor.events)


def hung_canary(calls: list):
    """A canary of a hung model: each call is noted, then times out."""
    def canary():
        calls.append(1)
        raise TimeoutError("no answer")
    return canary


def test_one_canary_failure_does_not_reload_two_in_a_row_do_and_a_success_resets_the_count(tmp_path, monkeypatch):
    answers = []  # what the canary does on each call: True answers, False fails

    def canary():
        if not answers.pop(0):
            raise TimeoutError("slow")

    fake, supervisor = canary_supervisor(tmp_path, monkeypatch, {"enc": canary})
    answers += [False, True, False]
    for _ in range(3):
        supervisor.check_canaries_once()
    time.sleep(0.2)  # a heal would have started a thread by now
    assert fake.loads == [] and not supervisor._healing and "enc" not in supervisor.unhealthy
    answers += [False]  # the second failure in a row
    supervisor.check_canaries_once()
    assert wait_for(lambda: healed(supervisor))
    assert [m for m, _, _ in fake.loads] == ["enc"]
    answers += [False]  # the count restarted after the heal
    supervisor.check_canaries_once()
    time.sleep(0.2)
    assert [m for m, _, _ in fake.loads] == ["enc"] and answers == []


def test_a_hang_whose_reload_failed_is_reloaded_again_on_the_next_canary_round(tmp_path, monkeypatch):
    calls = []
    fake, supervisor = canary_supervisor(tmp_path, monkeypatch, {"enc": hung_canary(calls)})
    fake.fail_loads = 1
    supervisor.check_canaries_once()
    supervisor.check_canaries_once()
    assert wait_for(lambda: any(e == "reload failed" for _, e, _ in supervisor.events) and not supervisor._healing)
    assert "enc" in supervisor.unhealthy  # nothing else would report the hang again: the canary round retries
    supervisor.check_canaries_once()
    assert wait_for(lambda: healed(supervisor))
    assert len(calls) == 2 and [m for m, _, _ in fake.loads] == ["enc", "enc"] and not supervisor.unhealthy


def test_canaries_skip_models_not_ready_unhealthy_or_being_healed(tmp_path, monkeypatch):
    calls = []
    fake, supervisor = canary_supervisor(tmp_path, monkeypatch, {"enc": hung_canary(calls)})
    fake.not_ready.add("enc")
    supervisor.check_canaries_once()
    fake.not_ready.clear()
    supervisor.unhealthy["enc"] = "stub process 5 of 'enc_0_0' died"
    supervisor.check_canaries_once()
    supervisor.unhealthy.clear()
    supervisor._healing.add("enc")
    supervisor.check_canaries_once()
    assert calls == [] and fake.loads == []
    supervisor._healing.clear()
    supervisor.check_canaries_once()
    assert calls == [1] and fake.loads == []


def test_a_blocked_canary_does_not_delay_the_healing_of_a_dead_stub(tmp_path, monkeypatch):
    import threading

    from supervisor import monitor
    from supervisor.monitor import Supervisor

    stubs = {"enc_0_0": 5}
    monkeypatch.setattr(monitor, "scan_stub_pids", lambda pid: {p: i for i, p in stubs.items()})
    fake = FakeTriton()
    load = fake.load_model
    fake.load_model = lambda *a, **k: (load(*a, **k), stubs.update({"enc_0_0": 6}))  # the reload's new stub
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()

    def blocked():  # a canary waiting for its timeout
        entered.set()
        release.wait(30)
        returned.set()

    supervisor = Supervisor(1, "unused", tmp_path / "s.json", client=fake, period_s=0.02,
                            canaries={"emb": blocked}, canary_period_s=0.05)
    supervisor.started = in_pid_order
    supervisor.start()
    try:
        assert entered.wait(20)
        stubs.clear()  # kill -9
        assert wait_for(lambda: healed(supervisor)), supervisor.events
        assert not returned.is_set()  # healed while the canary was still blocked
        assert [m for m, _, _ in fake.loads] == ["enc"]
    finally:
        release.set()
        supervisor.stop()


def test_two_stubs_of_one_instance_are_both_scanned(monkeypatch):
    from supervisor.stubs import by_instance, of_model, scan_stub_pids

    processes = FakeProcesses(monkeypatch)
    processes.add(100, 1, ["tritonserver"])
    processes.add(101, 100, stub_argv("enc", "enc_0_0"))  # the old version's, alive after a reload
    processes.add(105, 100, stub_argv("enc", "enc_0_0"))
    assert scan_stub_pids(100) == {101: "enc_0_0", 105: "enc_0_0"}
    assert scan_stubs(100) == {"enc_0_0": 105}  # the newer
    assert by_instance(scan_stub_pids(100), exclude={105}) == {"enc_0_0": 101}
    processes.add(99, 100, stub_argv("enc", "enc_0_0"), started=1000)  # a reused pid, started last
    assert scan_stubs(100) == {"enc_0_0": 99}, "the one that started last, not the higher pid"
    assert of_model({101: "enc_0_0", 102: "encoder_0_0"}, "enc") == {101: "enc_0_0"}


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_an_orphan_is_killed_once_idle_and_a_busy_one_only_when_overdue():
    from supervisor.orphans import Orphans

    cpu, killed, clock = {5: 1.0, 6: 2.0, 7: 3.0}, [], FakeClock()
    orphans = Orphans(idle_s=5, max_age_s=60, cpu=cpu.get, kill=killed.append, clock=clock)
    orphans.adopt("enc", {5, 6, 7})
    clock.now = 3
    cpu[6] += 0.1  # still finishing the requests it had when the reload came
    assert orphans.retire({5, 6, 7}) == [] and killed == []
    clock.now = 5.5
    assert orphans.retire({5, 6}) == [("enc", 5, "idle for 5.5 s")]  # 7 exited by itself: forgotten
    assert killed == [5] and orphans.pids() == {6}
    for second in range(6, 60):  # busy all along (a hung stub spinning)
        clock.now, cpu[6] = second, cpu[6] + 0.01
        assert orphans.retire({6}) == []
    clock.now, cpu[6] = 60, cpu[6] + 0.01
    assert orphans.retire({6}) == [("enc", 6, "still busy 60 s after the reload")] and killed == [5, 6]
    assert orphans.pids() == set()


def test_an_orphan_that_exits_as_it_is_killed_is_not_reported():
    from supervisor.orphans import Orphans

    def gone(pid):
        raise ProcessLookupError(pid)

    clock = FakeClock()
    orphans = Orphans(idle_s=1, cpu=lambda pid: 0.01, kill=gone, clock=clock)
    orphans.adopt("enc", {5})
    clock.now = 2
    assert orphans.retire({5}) == [] and orphans.pids() == set()


def test_a_heal_retires_the_old_versions_surviving_stub_once_idle(tmp_path, monkeypatch):
    """Two instances, one killed: the reload starts two new stubs, and the old version's survivor (pid 5), which
    Triton may never unload, is killed once idle; the tracker follows the new stubs, so its end is no death."""
    from supervisor import monitor
    from supervisor.monitor import Supervisor
    from supervisor.orphans import Orphans

    stubs = {5: "enc_0_0", 6: "enc_0_1"}
    monkeypatch.setattr(monitor, "scan_stub_pids", lambda pid: dict(stubs))
    fake = FakeTriton()
    load = fake.load_model
    fake.load_model = lambda *a, **k: (load(*a, **k), stubs.update({7: "enc_0_0", 8: "enc_0_1"}))
    killed, clock = [], FakeClock()
    supervisor = Supervisor(1, "unused", tmp_path / "s.json", client=fake)
    supervisor.started = in_pid_order
    supervisor.orphans = Orphans(idle_s=5, cpu=lambda pid: 0.42, kill=lambda pid: (killed.append(pid), stubs.pop(pid)),
                                 clock=clock)
    supervisor.check_once()
    del stubs[6]  # kill -9 of enc_0_1
    supervisor.check_once()
    supervisor.check_once()
    assert wait_for(lambda: healed(supervisor)), supervisor.events
    assert supervisor.orphans.pids() == {5} and killed == []
    supervisor.check_once()
    assert supervisor.tracker.known == {"enc_0_0": (7, 7), "enc_0_1": (8, 8)}
    clock.now = 6
    supervisor.check_once()
    assert killed == [5] and stubs == {7: "enc_0_0", 8: "enc_0_1"}
    supervisor.check_once()
    supervisor.check_once()
    events = [e for _, e, _ in supervisor.events]
    assert events == ["death detected", "reload started", "healed", "retired old stub"]
    assert [m for m, _, _ in fake.loads] == ["enc"]


def test_a_heal_waits_for_a_new_stub_not_the_hung_one_still_alive(tmp_path, monkeypatch):
    from supervisor import monitor
    from supervisor.monitor import Supervisor

    stubs = {5: "enc_0_0"}  # hung: alive, never answering
    monkeypatch.setattr(monitor, "scan_stub_pids", lambda pid: dict(stubs))
    supervisor = Supervisor(1, "unused", tmp_path / "s.json", client=FakeTriton())
    supervisor.started = in_pid_order
    supervisor.check_once()
    monkeypatch.setattr(supervisor, "_stubs_back", (lambda wait: lambda m, old: wait(m, old, timeout_s=0.3))(
        supervisor._stubs_back))
    assert not supervisor.heal("enc", "canary failed: no answer", {"enc", "emb"})  # no new stub came up
    assert supervisor.orphans.pids() == set()
    supervisor.client.load_model = lambda *a, **k: stubs.update({9: "enc_0_0"})
    assert supervisor.heal("enc", "canary failed: no answer", {"enc", "emb"})
    assert supervisor.orphans.pids() == {5}


# ---- issue 35, item 5: overload is not a hang, and an old front is retired only when it has no request ----

def test_a_canary_that_times_out_behind_a_full_generator_is_overload_not_a_hang(monkeypatch):
    import queue

    from tritonclient.utils import InferenceServerException

    from supervisor import canaries

    calls = []

    def fake_stream_call(client, model, inputs, timeout, headers=None):
        calls.append(timeout)
        if len(calls) == 1 or behaviour["refusal"] is None:
            raise queue.Empty  # the canary's own request waits for a row (or the front is hung)
        raise behaviour["refusal"]

    behaviour = {"refusal": InferenceServerException("temperature must be >= 0 and finite")}
    monkeypatch.setattr(canaries, "stream_call", fake_stream_call)
    canary = canaries.StreamCanary("127.0.0.1:1", "codegen_stream", None, timeout_s=20, liveness_timeout_s=3)
    canary()  # timed out, but the front refused a bad request at once: alive, overloaded
    assert canary.overloaded == 1 and calls == [20, 3]
    calls.clear()
    behaviour["refusal"] = None  # nothing answers: hung
    with pytest.raises(TimeoutError, match="no answer from codegen_stream"):
        canary()
    # refusals sent by the front's (or the generator's) own code are answers, not failures
    for message in ("the generator has 256 requests waiting for a row, its limit (max_pending_requests): retry later",
                    "64 requests in flight, the limit (max_in_flight=64): retry later",
                    "codegen_generator lost the request (its process was restarted): retry"):
        calls.clear()
        monkeypatch.setattr(canaries, "stream_call", lambda *a, m=message, **k: (_ for _ in ()).throw(
            InferenceServerException(m)))
        canary()
    assert set(canaries.default_canaries("127.0.0.1:1")) == {"codegen_stream", "codegen_collect"}


def test_an_old_fronts_stub_is_retired_only_when_its_own_count_says_no_request_is_in_flight():
    from supervisor.orphans import Orphans

    counts, killed, clock = {5: 3}, [], FakeClock()
    # pid 5 counts its requests (a BLS front waiting on its callee: no CPU), pid 6 does not (CPU rule)
    orphans = Orphans(idle_s=5, max_age_s=600, cpu=lambda pid: 0.42, kill=killed.append, clock=clock,
                      in_flight=lambda: dict(counts))
    orphans.adopt("codegen_stream", {5})
    orphans.adopt("enc", {6})
    clock.now = 30  # no CPU for 30 s: the idle rule alone would have killed the front with 3 live streams
    assert orphans.retire({5, 6}) == [("enc", 6, "idle for 30.0 s")] and killed == [6]
    counts[5] = 0
    assert orphans.retire({5}) == [("codegen_stream", 5, "no request in flight")]
    orphans.adopt("codegen_stream", {7})
    counts[7] = 1
    clock.now = 700  # a hung front: its requests never end
    assert orphans.retire({7}) == [("codegen_stream", 7, "still 1 request(s) in flight 670 s after the reload")]


def test_the_in_flight_gauge_is_read_per_stub_pid_from_prometheus_text():
    from supervisor.metrics_text import gauge_by_label

    text = ('# TYPE bls_front_requests_in_flight gauge\n'
            'bls_front_requests_in_flight{model="codegen_stream",stub_pid="123"} 3\n'
            'bls_front_requests_in_flight{model="codegen_collect",stub_pid="9"} 0\n'
            'nv_inference_count{model="x",stub_pid="1"} 5\n')
    assert gauge_by_label(text, "bls_front_requests_in_flight", "stub_pid") == {"123": 3.0, "9": 0.0}


def test_the_supervisor_reads_the_gauge_the_fronts_publish():
    """The family name lives on both sides (the supervisor does not import the Triton-bound stage code)."""
    from supervisor.orphans import IN_FLIGHT_FAMILY

    source = (Path(__file__).resolve().parent.parent / "backends" / "stage_common" / "in_flight_metric.py").read_text()
    assert f'FAMILY = "{IN_FLIGHT_FAMILY}"' in source
