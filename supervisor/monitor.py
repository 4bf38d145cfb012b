"""The supervisor: a thread beside tritonserver that heals models whose Python stub died or hung.

Triton 2.51 never restarts a stub, and an explicit-mode load of an unchanged model is a no-op, so the
supervisor reloads the model with its own current configuration as an override, which Triton always
applies (new stubs, ~2 s; the ensembles that use the model keep their READY state). Until the model is
healed, it and the ensembles that use it are written to the state file that the gateway's /health reads.

A hung stub stays alive, so the stub scan cannot see it: canaries (a call per model that raises when the model
does not answer) run on their own thread, so that one blocked for its timeout never delays the scan, and a
model whose canary fails `canary_failures` times in a row is healed like a dead one."""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from supervisor.health_threads import HealthThreads
from supervisor.orphans import Orphans, read_in_flight, read_stuck_calls
from supervisor.state import write_state
from supervisor.processes import start_time
from supervisor.stubs import StubTracker, expected_instances, of_model, scan_stub_pids

log = logging.getLogger("supervisor")
CANARY_FAILED = "canary failed: "  # the reason of a heal that a canary asked for
# the reason of a front's heal when it did not answer right after a model it calls was healed (issue 48)
HUNG_AFTER_HEAL = CANARY_FAILED + "no answer right after the heal of "
# the reason of a live front's replacement: calls it lost with a dead callee still hold Triton threads
REPLACED = "replaced: "
ADMIN_HEADER = "triton-admin-key"  # the header that unlocks Triton's restricted model-control API
GRPC_PREFIX = "triton-grpc-protocol-"  # Triton's gRPC frontend expects restricted headers under this prefix


def admin_headers(key: str | None, protocol: str = "grpc") -> dict[str, str] | None:
    """The header for tritonclient calls: `triton-grpc-protocol-triton-admin-key` over gRPC, plain over HTTP."""
    return {(GRPC_PREFIX if protocol == "grpc" else "") + ADMIN_HEADER: key} if key else None


def _uses(config: dict, target: str) -> bool:
    """An ensemble step, or a BLS model naming it in a parameter (e.g. codegen_stream's `generator_model`)."""
    steps = config.get("ensemble_scheduling", {}).get("step", [])
    parameters = config.get("parameters", {})
    return any(s.get("model_name") == target for s in steps) or \
        any(isinstance(p, dict) and p.get("string_value") == target for p in parameters.values())


def ensembles_using(configs: dict[str, dict], model: str) -> set[str]:
    """Ensembles and BLS pipelines that (transitively) call `model`."""
    users: set[str] = set()
    todo = [model]
    while todo:
        target = todo.pop()
        for name, config in configs.items():
            if name not in users and name != model and _uses(config, target):
                users.add(name)
                todo.append(name)
    return users


class Supervisor:
    def __init__(self, server_pid: Callable[[], int | None] | int, grpc_url: str, state_file: Path | None,
                 admin_key: str | None = None, period_s: float = 0.25,
                 canaries: dict[str, Callable[[], None]] | None = None, canary_period_s: float = 5.0,
                 canary_failures: int = 2, client=None, metrics_url: str | None = None,
                 after_heal_timeout_s: float = 6.0, stuck_limit: int = 64):
        import tritonclient.grpc as grpcclient

        self._server_pid = server_pid if callable(server_pid) else (lambda: server_pid)
        self.client = client or grpcclient.InferenceServerClient(grpc_url)
        self.state_file = Path(state_file) if state_file else None
        self.headers = admin_headers(admin_key)
        self.period_s = period_s
        self.canaries = dict(canaries or {})
        self.canary_period_s = canary_period_s
        # a single slow answer under load is not a hang: a reload fails every request in flight
        self.canary_failures = canary_failures
        # right after a heal, each BLS front that calls the healed model must answer within this (issue 48)
        self.after_heal_timeout_s = after_heal_timeout_s
        self.stuck_settle_s = 6.0
        # a live front is replaced once this many of its Triton backend threads (launcher/triton_server.py's
        # pool of 256) are held by calls lost with dead stubs: ~60 per generator kill under a full load, so
        # another kill still finds room, and a front is not reloaded for a few
        self.stuck_limit = stuck_limit
        self._canary_misses: dict[str, int] = {}  # model -> consecutive canary failures
        self._canary_heal_failed: dict[str, str] = {}  # model -> reason: its canary's heal failed, retried
        self.tracker = StubTracker()
        self.health_threads = HealthThreads()  # each stub's health thread real-time (health_threads.py says why)
        self.started = start_time  # pid -> start time: with the pid, a stub's identity (tests inject theirs)
        # the old version's stubs a heal left alive, killed once idle: a BLS front's once it has no request in
        # flight (its own count, from /metrics), another's once it uses no CPU
        self.orphans = Orphans(in_flight=(lambda: read_in_flight(metrics_url)) if metrics_url else None)
        self.metrics_url = metrics_url
        self.unhealthy: dict[str, str] = {}
        self.events: list[tuple[float, str, str]] = []  # (unix time, event, model): read by tests and the soak
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._canary_thread: threading.Thread | None = None
        self._healing: set[str] = set()
        self._lock = threading.Lock()  # unhealthy, _healing and the state file, shared by the threads
        self._publish()

    # -- life cycle
    def start(self) -> "Supervisor":
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)
        self._thread.start()
        if self.canaries:
            self._canary_thread = threading.Thread(target=self._run_canaries, name="supervisor-canaries", daemon=True)
            self._canary_thread.start()
        return self

    def request_stop(self) -> None:
        """From a signal handler: no new checks or heals (a server shutting down unloads every model)."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self._canary_thread is not None:
            self._canary_thread.join(5)  # a canary in flight may wait for its timeout: a daemon, not waited for
        deadline = time.monotonic() + 60
        while self._healing and time.monotonic() < deadline:  # a reload in flight finishes first
            time.sleep(0.1)
        self.client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.check_once()
            except Exception as exc:  # the server may be starting or stopping: keep watching
                log.debug("supervisor: check failed: %s", exc)
            self._stop.wait(self.period_s)

    def _run_canaries(self) -> None:
        next_round = time.monotonic() + self.canary_period_s
        while not self._stop.wait(max(0.0, next_round - time.monotonic())):
            next_round = time.monotonic() + self.canary_period_s  # start to start: a failing round takes longer
            try:
                self.check_canaries_once()
            except Exception as exc:
                log.debug("supervisor: canary round failed: %s", exc)

    # -- one round
    def ready_models(self) -> set[str]:
        index = self.client.get_model_repository_index(headers=self.headers, as_json=True).get("models", [])
        return {m["name"] for m in index if m.get("state") == "READY"}

    def check_once(self) -> None:
        pid = self._server_pid()
        if not pid:
            return
        ready = self.ready_models()
        stubs = scan_stub_pids(pid)
        self.health_threads.update(stubs)
        for model, stub, why in self.orphans.retire(set(stubs)):
            self._event("retired old stub", model, f"pid {stub}, {why}")
        # an orphan shares its instance's name with the new stub: the tracker follows the newest by start time
        orphans = self.orphans.pids()
        deaths = self.tracker.update({p: i for p, i in stubs.items() if p not in orphans}, ready, self.started,
                                     self.expected_instances)
        if deaths:
            ready = self.ready_models()  # re-check: an unload in progress is not a death
            for model, reason in deaths.items():
                self._start_heal(model, reason, ready)

    def check_canaries_once(self) -> None:
        """One round of canaries (the canary thread's): each READY model's that is neither unhealthy nor being
        healed; the `canary_failures`-th failure in a row heals the model."""
        ready = self.ready_models()
        for model, canary in self.canaries.items():
            if self._stop.is_set():
                return
            if model not in ready or model in self._healing:
                self._canary_misses.pop(model, None)
                continue
            if model in self._canary_heal_failed:  # retried each round, as a death is on each scan
                self._start_heal(model, self._canary_heal_failed[model], ready)
                continue
            if model in self.unhealthy:  # dead, or a step of it is: healed by the scan
                self._canary_misses.pop(model, None)
                continue
            try:
                canary()
            except Exception as exc:
                misses = self._canary_misses[model] = self._canary_misses.get(model, 0) + 1
                self._event("canary failed", model, f"({misses}/{self.canary_failures}) {str(exc)[:200]}")
                if misses >= self.canary_failures:
                    self._canary_misses.pop(model, None)
                    # re-check: an unload in progress is not a hang
                    self._start_heal(model, CANARY_FAILED + str(exc)[:200], self.ready_models())
            else:
                self._canary_misses.pop(model, None)

    def _start_heal(self, model: str, reason: str, ready: set[str]) -> None:
        with self._lock:  # the scan and the canaries may both ask
            if model not in ready or model in self._healing or self._stop.is_set():
                return
            self._healing.add(model)
        # one thread per heal: a slow reload (the generator) must not delay another model's
        threading.Thread(target=self._heal_in_background, args=(model, reason, ready),
                         name=f"heal-{model}", daemon=True).start()

    def _heal_in_background(self, model: str, reason: str, ready: set[str]) -> None:
        healed = False
        try:
            healed = self.heal(model, reason, ready)
        except Exception as exc:
            self._event("reload failed", model, str(exc)[:300])
        finally:
            if healed:
                self._canary_heal_failed.pop(model, None)
            elif reason.startswith(CANARY_FAILED):  # nothing else reports a hang again: the canary thread retries
                self._canary_heal_failed[model] = reason
            self._healing.discard(model)

    def config(self, model: str) -> dict:
        return self.client.get_model_config(model, as_json=True)["config"]

    def expected_instances(self, model: str) -> set[str] | None:
        """The instances the model's loaded configuration has (None: unknown, every instance counts)."""
        try:
            return expected_instances(model, self.config(model))
        except Exception as exc:  # noqa: BLE001 - e.g. unloaded meanwhile: the READY re-check decides
            log.debug("supervisor: no config of %s: %s", model, exc)
            return None

    def heal(self, model: str, reason: str, ready: set[str]) -> bool:
        started, replacing = time.time(), reason.startswith(REPLACED)
        self._event("hang detected" if reason.startswith(CANARY_FAILED) else "replacing" if replacing
                    else "death detected", model, reason)
        configs = {m: self.config(m) for m in ready}  # fresh: the gateway may have reloaded some
        affected = {model, *ensembles_using(configs, model)}
        if not replacing:  # a replaced model serves on meanwhile (its old stub, then the new one)
            with self._lock:
                for name in affected:
                    self.unhealthy[name] = reason if name == model else f"step '{model}' is down: {reason}"
            self._publish()
        self._event("reload started", model, "config override")
        before = self._stub_pids(model)  # a dead stub's surviving batch-mates, or a hung stub
        try:
            # Triton skips a load when nothing changed (a plain load of an unchanged model, or the same
            # override twice): a fresh marker parameter makes every heal's override a new configuration.
            config = dict(configs[model])
            config["parameters"] = {**config.get("parameters", {}),
                                    "supervisor_reload": {"string_value": f"{time.time():.6f}"}}
            self.client.load_model(model, config=json.dumps(config), headers=self.headers)
            if not self._stubs_back(model, before):
                raise RuntimeError("the reload started no stub")
        except Exception as exc:
            self._event("reload failed", model, str(exc)[:300])
            return False  # still unhealthy; the tracker reports it again on the next scans and we retry
        old = before & set(self._stub_pids(model))
        if reason.startswith(HUNG_AFTER_HEAL):
            self._kill_hung(model, old)
        else:
            self.orphans.adopt(model, old)
        self.tracker.healed(model)
        with self._lock:
            for name in affected:
                self.unhealthy.pop(name, None)
        self._publish()
        self._event("replaced" if replacing else "healed", model, f"in {time.time() - started:.2f}s")
        if replacing:
            return True
        for front in sorted(m for m in affected - {model} if hasattr(self.canaries.get(m), "alive")):
            threading.Thread(target=self._check_front_after_heal, args=(model, front),
                             name=f"after-heal-{front}", daemon=True).start()
        return True

    def _check_front_after_heal(self, model: str, front: str) -> None:
        """Triton 2.51 never answers a BLS call that was in flight on a stub that died, and each such call holds
        one of its caller's Python-backend threads (the backend waits for the call's first response on a pool
        thread, which the caller's response sends need too): a front whose threads all wait on the dead stub's
        calls answers nothing again, though the callee is back. So right after a heal, each BLS front that calls
        the healed model must refuse a bad request within after_heal_timeout_s (its canary's liveness check); one
        that does not is hung and healed now, not after canary_failures canary rounds (issue 48: ~72 s). One that
        answers but holds stuck_limit or more calls lost with dead stubs is replaced (a new stub, a new pool)
        without a moment down."""
        if self._stop.is_set():
            return
        try:
            alive = self.canaries[front].alive(self.after_heal_timeout_s)
            if not alive:
                self._start_heal(front, f"{HUNG_AFTER_HEAL}{model}", self.ready_models())
            elif (stuck := self._stuck_calls(front)) >= self.stuck_limit:
                self._start_heal(front, f"{REPLACED}{stuck} calls lost with {model}'s old stub still hold "
                                        "Triton backend threads", self.ready_models())
        except Exception as exc:  # noqa: BLE001 - e.g. the server went down meanwhile: the scan goes on
            log.debug("supervisor: after-heal check of %s failed: %s", front, exc)

    def _stuck_calls(self, front: str) -> int:
        """The calls into a dead callee that the front gave up on but that still block (bls_front_calls_stuck
        on /metrics, its newest stub's), waiting up to stuck_settle_s for them to show (a lost call is given up
        within a probe interval or two): each holds one thread of the front's Triton-side pool for good, and a
        front that loses them on every heal would run out (issue 48). A new stub gets a new pool, and the old one
        finishes its requests first (retired by the orphan rule)."""
        if not self.metrics_url:
            return 0
        deadline = time.monotonic() + self.stuck_settle_s
        while not self._stop.is_set():
            try:
                newest = max(self._stub_pids(front), key=lambda pid: self.started(pid) or 0, default=-1)
                stuck = read_stuck_calls(self.metrics_url).get(newest, 0)
            except Exception as exc:  # noqa: BLE001 - metrics unreachable: nothing to go by
                log.debug("supervisor: no stuck-call count of %s: %s", front, exc)
                return 0
            if stuck >= self.stuck_limit or time.monotonic() >= deadline:
                return stuck
            time.sleep(0.5)
        return 0

    def _kill_hung(self, model: str, pids: set[int]) -> None:
        """A hung front's old stubs go at once: their requests can no longer be answered, and Triton answers
        them (with an error) only once the stub is gone."""
        for pid in self.orphans.kill_now(pids):
            self._event("retired old stub", model, f"pid {pid}, hung")

    def _stub_pids(self, model: str) -> set[int]:
        pid = self._server_pid()
        return set(of_model(scan_stub_pids(pid), model)) if pid else set()

    def _stubs_back(self, model: str, old: set[int], timeout_s: float = 5.0) -> bool:
        """Each instance of the model runs a stub that is not one of the `old` pids (a model with no Python
        stub, e.g. an ensemble, counts as back)."""
        pid = self._server_pid()
        if not pid or not self.tracker.instances(model):
            return True
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            alive = {instance for stub, instance in scan_stub_pids(pid).items() if stub not in old}
            if all(i in alive for i in self.tracker.instances(model)):
                return True
            time.sleep(0.05)
        return False

    def _event(self, event: str, model: str, detail: str = "") -> None:
        self.events.append((time.time(), event, model))
        log.warning("supervisor: %s: %s %s", event, model, detail)

    def _publish(self) -> None:
        if self.state_file is not None:
            with self._lock:
                self.state_file.parent.mkdir(parents=True, exist_ok=True)
                write_state(self.state_file, dict(self.unhealthy))
