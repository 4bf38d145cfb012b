"""Issue 48, the supervisor's side (no server): right after it heals a model, each BLS front that calls it
must refuse a bad request at once; a front that does not is hung and healed now (its old stub killed, its
requests answered), and one that answers but has stuck_limit calls stuck on dead stubs is replaced without a
moment down (its old stub retired by the orphan rule); one with fewer is left alone. Calls stuck after a caller gave up are counted
(stage_common/bls_deadline.StuckCalls)."""
from __future__ import annotations

import threading

import pytest

from stage_common.bls_deadline import CallLost, StuckCalls, call_with_deadline
from test_supervisor_unit import FakeTriton, in_pid_order, wait_for

GEN_STUB, FRONT_STUB = 5, 7


class FakeCanary:
    """A front's canary: `alive` says whether the front refused a bad request in time."""

    def __init__(self, alive: bool):
        self.answers, self.timeouts = alive, []

    def __call__(self):
        pass

    def alive(self, timeout_s=None):
        self.timeouts.append(timeout_s)
        return self.answers


def after_heal(tmp_path, monkeypatch, alive: bool, stuck: int):
    from supervisor import monitor
    from supervisor.monitor import Supervisor

    stubs = {GEN_STUB: "gen_0_0", FRONT_STUB: "front_0_0"}
    monkeypatch.setattr(monitor, "scan_stub_pids", lambda pid: dict(stubs))
    monkeypatch.setattr(monitor, "read_stuck_calls", lambda url: {FRONT_STUB: stuck})
    fake = FakeTriton()
    fake.configs = {"gen": {"name": "gen"},
                    "front": {"name": "front", "parameters": {"generator_model": {"string_value": "gen"}}}}
    load = fake.load_model

    def reload(model, *args, **kwargs):  # each reload starts a new stub; the old one lives on until killed
        load(model, *args, **kwargs)
        stubs[max(stubs) + 1] = f"{model}_0_0"

    fake.load_model = reload
    canary = FakeCanary(alive)
    supervisor = Supervisor(1, "unused", tmp_path / "s.json", client=fake, canaries={"front": canary},
                            metrics_url="http://127.0.0.1:9/metrics", after_heal_timeout_s=3.0)
    supervisor.started, supervisor.stuck_settle_s = in_pid_order, 0.2
    killed: list[int] = []
    supervisor.orphans._kill = killed.append
    for pid, instance in stubs.items():
        supervisor.tracker.update({pid: instance}, {"gen", "front"}, in_pid_order, lambda m: None)
    return fake, supervisor, canary, killed


def events(supervisor, model="front"):
    return [e for _, e, m in supervisor.events if m == model]


def test_a_front_that_does_not_answer_right_after_its_callees_heal_is_healed_at_once_and_its_old_stub_killed(
        tmp_path, monkeypatch):
    fake, supervisor, canary, killed = after_heal(tmp_path, monkeypatch, alive=False, stuck=0)
    assert supervisor.heal("gen", "stub died", {"gen", "front"})
    assert wait_for(lambda: "healed" in events(supervisor))
    assert [m for m, _, _ in fake.loads] == ["gen", "front"]
    assert canary.timeouts == [3.0]
    assert events(supervisor)[0] == "hang detected"
    assert killed == [FRONT_STUB], "a hung front's old stub goes at once (its requests are then answered)"
    assert "retired old stub" in events(supervisor)


def test_a_live_front_with_many_calls_stuck_on_dead_stubs_is_replaced_without_being_reported_down(
        tmp_path, monkeypatch):
    from gateway.supervisor_state import unhealthy_models  # what /health reads

    fake, supervisor, _, killed = after_heal(tmp_path, monkeypatch, alive=True, stuck=64)
    seen: list[dict] = []
    load = fake.load_model
    fake.load_model = lambda model, *a, **k: (seen.append(unhealthy_models(tmp_path / "s.json")), load(model, *a, **k))
    assert supervisor.heal("gen", "stub died", {"gen", "front"})
    assert wait_for(lambda: "replaced" in events(supervisor))
    assert [m for m, _, _ in fake.loads] == ["gen", "front"]
    assert events(supervisor) == ["replacing", "reload started", "replaced"]
    assert "front" not in seen[-1], "/health never calls a front being replaced down: it serves on"
    assert killed == [] and FRONT_STUB in supervisor.orphans.pids(), "the old stub finishes its requests first"


@pytest.mark.parametrize("stuck", [0, 63])
def test_a_front_that_answers_and_lost_nothing_or_a_few_calls_is_left_alone(tmp_path, monkeypatch, stuck):
    fake, supervisor, canary, killed = after_heal(tmp_path, monkeypatch, alive=True, stuck=stuck)
    assert supervisor.heal("gen", "stub died", {"gen", "front"})
    assert wait_for(lambda: canary.timeouts)
    threading.Event().wait(0.6)  # past stuck_settle_s
    assert [m for m, _, _ in fake.loads] == ["gen"] and events(supervisor) == [] and killed == []


def test_a_call_given_up_on_counts_as_stuck_until_its_thread_returns():
    counts: list[int] = []
    stuck, release = StuckCalls(counts.append), threading.Event()
    with pytest.raises(CallLost):
        call_with_deadline(release.wait, "callee", 60, probe=lambda: False, probe_every_s=0.01, grace_s=0.01,
                           stuck=stuck)
    assert stuck.count == 1
    release.set()
    assert wait_for(lambda: stuck.count == 0) and counts == [1, 0]
    assert call_with_deadline(lambda: 1, "callee", 5, stuck=stuck) == 1 and counts == [1, 0], \
        "an answered call never counts"


def test_the_after_heal_check_is_the_canarys_liveness_check_with_its_own_timeout(monkeypatch):
    from tritonclient.utils import InferenceServerException

    from supervisor import canaries

    timeouts = []

    def refused(client, model, inputs, timeout, headers=None):
        timeouts.append(timeout)
        raise InferenceServerException("temperature must be >= 0 and finite")

    monkeypatch.setattr(canaries, "stream_call", refused)
    canary = canaries.StreamCanary("127.0.0.1:1", "codegen_stream", None, timeout_s=20, liveness_timeout_s=10)
    assert canary.alive(1.5) and canary.alive() and timeouts == [1.5, 10]
    monkeypatch.setattr(canaries, "stream_call", lambda *a, **k: (_ for _ in ()).throw(TimeoutError()))
    assert not canary.alive(1.5), "no answer in time: hung"
