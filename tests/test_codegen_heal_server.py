"""Issue 35 against a live tritonserver + supervisor, with time limits scaled down through the models' own
parameters (config overrides): an out-of-vocabulary id beside live streams; a stream that waits for a row
longer than the abandon time; the canaries and the retirement of an old front under a full generator; a death
beside an older stub of the same name; an instance count lowered; the generator killed under unary load.

Own tritonserver (these tests reload and kill stubs), the codegen pipelines only, once per generator engine; the
generator kill runs last."""
from __future__ import annotations

import json
import math
import os
import queue
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from codegen_engines import ENGINES, long_prompt, repository_with_engine
from launcher.processes import free_port
from launcher.triton_server import TritonServer
from supervisor.canaries import StreamCanary, UnaryCanary
from supervisor.codegen_probe import request_inputs, stream_call
from supervisor.monitor import Supervisor
from supervisor.processes import start_time
from supervisor.stubs import of_model, scan_stub_pids

pytestmark = pytest.mark.integration
TIMEOUT = 120
HOLDER_TOKENS = 512  # a holder's request: a prompt the demo model runs to this many tokens (long_prompt)


@pytest.fixture(scope="module", params=ENGINES)
def live(tmp_path_factory, request):
    """A server of the codegen models with the generator on one engine (its config on disk says which, so the
    supervisor's reloads keep it)."""
    folder = tmp_path_factory.mktemp(f"heal_{request.param}")
    server = TritonServer(http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          model_repository=repository_with_engine(folder / "models", request.param),
                          explicit_models=["codegen_generator", "codegen", "codegen_stream"],
                          log_file=folder / "tritonserver.log")
    server.start(timeout=300)
    supervisor = Supervisor(server.process.pid, server.grpc_url, folder / "supervisor.json",
                            metrics_url=server.metrics_url).start()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        yield server, supervisor, client
    finally:
        client.close()
        supervisor.stop()
        server.stop()


def reload(client, model: str, instances: int | None = None, **parameters) -> None:
    """Load `model` with its current configuration, some parameters changed (a fresh marker each time, so that
    Triton never skips the load as unchanged)."""
    config = client.get_model_config(model, as_json=True)["config"]
    config["parameters"] = {**config.get("parameters", {}), "test_reload": {"string_value": f"{time.time():.6f}"},
                            **{k: {"string_value": str(v)} for k, v in parameters.items()}}
    if instances is not None:
        config["instance_group"] = [{**config["instance_group"][0], "count": instances}]
    client.load_model(model, config=json.dumps(config))


def unary(url: str, prompt: str, max_tokens: int):
    client = grpcclient.InferenceServerClient(url)
    try:
        return client.infer("codegen", request_inputs(prompt, max_tokens), client_timeout=TIMEOUT)
    finally:
        client.close()


def in_background(fn, *args) -> tuple[threading.Thread, dict]:
    """Run fn(*args) on a thread: (thread, {"result": ...} or {"error": ...})."""
    out: dict = {}

    def run():
        try:
            out["result"] = fn(*args)
        except Exception as exc:  # noqa: BLE001 - inspected by the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def timed_stream(url: str, prompt: str, max_tokens: int) -> tuple[float, str, int]:
    """(seconds to the first response, final finish_reason, completion_tokens) of one codegen_stream call."""
    client = grpcclient.InferenceServerClient(url)
    events: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    started, first = time.monotonic(), None
    try:
        client.async_stream_infer("codegen_stream", request_inputs(prompt, max_tokens), enable_empty_final_response=True)
        while True:
            result, error = events.get(timeout=TIMEOUT)
            if error is not None:
                raise error
            first = first or time.monotonic() - started
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                break
            last = result
        reason = result.as_numpy("finish_reason") if response.outputs else last.as_numpy("finish_reason")
        count = result.as_numpy("completion_tokens") if response.outputs else last.as_numpy("completion_tokens")
        return first, reason.reshape(-1)[0].decode(), int(count.reshape(-1)[0])
    finally:
        client.stop_stream()
        client.close()


def row_holders(server, seconds: float) -> list[tuple[threading.Thread, dict]]:
    """Unary requests in the background that keep a one-row generator busy for about `seconds`, one after the
    other: each runs to HOLDER_TOKENS (a prompt the demo model never ends early), and how long one takes depends
    on the engine (OpenVINO runs the demo model several times faster than torch), so it is measured."""
    prompt = long_prompt(server.grpc_url, HOLDER_TOKENS)  # its search also sets the pipeline up
    started = time.monotonic()
    unary(server.grpc_url, prompt, HOLDER_TOKENS)
    count = min(60, max(2, math.ceil(seconds / max(time.monotonic() - started, 0.05))))
    return [in_background(unary, server.grpc_url, prompt, HOLDER_TOKENS) for _ in range(count)]


def events_after(supervisor, since: float, event: str, model: str) -> list[float]:
    return [t for t, e, m in supervisor.events if e == event and m == model and t > since]


def newest_stub(server, model: str) -> int:
    stubs = of_model(scan_stub_pids(server.process.pid), model)
    return max(stubs, key=lambda pid: start_time(pid) or 0)


def generator_gauges(server) -> tuple[float, float]:
    """(rows decoding, requests waiting for a row) from the generator's own gauges on /metrics."""
    import urllib.request

    from supervisor.metrics_text import gauge_by_label

    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return (gauge_by_label(text, "codegen_generator_active_sequences", "model").get("codegen_generator", 0),
            gauge_by_label(text, "codegen_generator_pending_requests", "model").get("codegen_generator", 0))


def wait_for_holders(server, holders: list) -> None:
    """Every holder is in the generator (its one row, or queued for it) or already answered. A holder the
    demo model ended early (end of text) never comes back to the queue: waiting for all five queued at
    once then waited out TIMEOUT on a loaded box, where the fifth arrived after the first had ended."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        running, pending = generator_gauges(server)
        answered = sum(1 for _, out in holders if out)
        if running >= 1 and running + pending + answered >= len(holders):
            return
        assert time.monotonic() < deadline, (f"the holders never all reached the generator: {running} running, "
                                             f"{pending} waiting, {answered} answered")
        time.sleep(0.1)


def test_an_out_of_vocabulary_id_is_refused_alone_beside_four_live_streams(live):
    """Item 1: the bad request gets its refusal, the four streams end normally (they all failed before)."""
    server, _, _ = live
    streams = [in_background(timed_stream, server.grpc_url, "def f(x):", 48) for _ in range(4)]
    time.sleep(0.5)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for bad in ([999_999], [-1]):
            inputs = []
            for name, array in (("input_ids", np.array([[5] + bad], np.int32)),
                                ("input_lengths", np.array([[2]], np.int32)),
                                ("request_output_len", np.array([[4]], np.int32))):
                tensor = grpcclient.InferInput(name, list(array.shape), "INT32")
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            with pytest.raises(InferenceServerException, match=r"input_ids must lie in \[0, "):
                stream_call(client, "codegen_generator", inputs, TIMEOUT)
    finally:
        client.close()
    for thread, out in streams:
        thread.join(TIMEOUT)
        assert "error" not in out, out
        _, reason, count = out["result"]
        assert reason in ("stop", "length") and count > 0


def test_waiting_for_a_row_canaries_under_a_full_generator_and_an_old_front_with_a_live_stream(live):
    """Items 6 and 5. One generator row, held by unary requests: a stream queued behind them waits longer than
    the (scaled-down) abandon time and still gets every token with finish_reason "length"; the canaries time out
    waiting for the row but find the fronts alive (overload, not a hang); and codegen_stream reloaded while the
    stream waits leaves an orphan that is not retired while the stream is in flight (its CPU is idle)."""
    server, supervisor, client = live
    reload(client, "codegen_generator", max_active_sequences=1, pulled_stream_abandon_s=1.0)
    try:
        holders = row_holders(server, 4.0)  # the stream must wait past the abandon time behind them
        wait_for_holders(server, holders)  # the holders queue first
        # the holders' prompt (greedy, it runs past 64 tokens): "length" proves the stream was not cut off
        prompt = long_prompt(server.grpc_url, HOLDER_TOKENS)
        stream_thread, stream = in_background(timed_stream, server.grpc_url, prompt, 64)
        time.sleep(0.5)
        # item 5: the canaries' requests wait for the row too; the fronts refuse a bad one at once
        for canary in (StreamCanary(server.grpc_url, "codegen_stream", None, timeout_s=1.0),
                       UnaryCanary(server.grpc_url, "codegen_collect", None, timeout_s=1.0)):
            started = time.monotonic()
            held = not all(out for _, out in holders)  # a holder still waits: the row is taken
            canary()  # raised before: a timeout was a hang
            # a holder may end early (a stop sequence) and free the row: then the canary is simply answered
            if held and not all(out for _, out in holders):
                assert canary.overloaded == 1, (canary.model, canary.refusals, time.monotonic() - started,
                                                [out for _, out in holders], stream)
        # item 5: reload the front under the waiting stream; the old stub (idle CPU) must outlive the stream
        supervisor.orphans.idle_s = 0.5  # scaled down: the CPU rule alone would kill it at once
        before = set(of_model(scan_stub_pids(server.process.pid), "codegen_stream"))
        healed_at = time.time()
        assert supervisor.heal("codegen_stream", "test: reload under a live stream",
                               {"codegen_stream", "codegen_generator"})
        stream_thread.join(TIMEOUT)
        assert "error" not in stream, stream
        waited, reason, count = stream["result"]
        assert waited > 1.0, f"the stream waited only {waited:.2f} s for its row: no proof"
        assert (reason, count) == ("length", 64), "cut off after waiting for a row (item 6)"
        retired = [(t, e, m) for t, e, m in supervisor.events if e == "retired old stub" and t > healed_at]
        assert not [r for r in retired if r[0] < healed_at + waited], retired
        for thread, out in holders:
            thread.join(TIMEOUT)
            assert "error" not in out, out
        deadline = time.monotonic() + 30  # then the old stub goes (Triton's unload, or retired with 0 in flight)
        while before & set(scan_stub_pids(server.process.pid)) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert not before & set(scan_stub_pids(server.process.pid)), "the old front's stub outlived its requests"
    finally:
        reload(client, "codegen_generator")


def test_the_death_of_the_new_stub_beside_an_old_one_of_the_same_name_is_healed(live):
    """Item 2: an old codegen_collect kept alive by a request in flight, plus the reload's new one. Killing the
    new one went unseen (the old one carried the name) and every codegen request failed."""
    server, supervisor, client = live
    reload(client, "codegen_generator", max_active_sequences=1)
    try:
        holders = row_holders(server, 8.0)
        time.sleep(1.0)
        old = newest_stub(server, "codegen_collect")
        reload(client, "codegen_collect")  # the old stub stays: its request is in flight
        new = newest_stub(server, "codegen_collect")
        assert new != old and old in scan_stub_pids(server.process.pid), "no two stubs share the name"
        killed_at = time.time()
        os.kill(new, signal.SIGKILL)
        deadline = time.time() + 30
        while not events_after(supervisor, killed_at, "healed", "codegen_collect") and time.time() < deadline:
            time.sleep(0.1)
        assert events_after(supervisor, killed_at, "death detected", "codegen_collect"), supervisor.events[-5:]
        assert events_after(supervisor, killed_at, "healed", "codegen_collect"), supervisor.events[-5:]
        for thread, _ in holders:
            thread.join(TIMEOUT)
    finally:
        reload(client, "codegen_generator")
    result = unary(server.grpc_url, "def f():", 4)  # serving again
    assert result.as_numpy("finish_reason").reshape(-1)[0].decode() in ("stop", "length")


def test_lowering_an_instance_count_is_not_a_death(live):
    """Item 4: the dropped instance's stub ends with the old version; the supervisor reloaded every ~5 s."""
    server, supervisor, client = live
    reload(client, "codegen_collect", instances=2)
    time.sleep(2)  # the supervisor learns both instances
    assert {"codegen_collect_0_0", "codegen_collect_0_1"} <= set(supervisor.tracker.instances("codegen_collect"))
    lowered_at = time.time()
    reload(client, "codegen_collect", instances=1)
    time.sleep(6)
    assert not events_after(supervisor, lowered_at, "death detected", "codegen_collect"), supervisor.events[-5:]
    assert supervisor.tracker.instances("codegen_collect") == ["codegen_collect_0_0"]
    assert "codegen_collect" not in supervisor.unhealthy


def test_a_generator_killed_under_unary_load_fails_its_requests_at_once_and_codegen_serves_after_the_heal(live,
                                                                                                   request):
    """Item 3: unary requests in flight on a killed generator stub were never answered and held codegen_collect's
    workers: fresh requests hit DEADLINE_EXCEEDED minutes after the heal. Now each in-flight request fails with
    UNAVAILABLE within a few probe intervals, and codegen serves as soon as the generator is back."""
    server, supervisor, client = live
    reload(client, "codegen_generator", max_active_sequences=1)  # requests queue for the row: long in flight
    prompt = long_prompt(server.grpc_url, HOLDER_TOKENS)
    in_flight = [in_background(unary, server.grpc_url, prompt, HOLDER_TOKENS) for _ in range(16)]
    deadline = time.monotonic() + TIMEOUT  # killed once requests wait for the row, however fast the engine runs
    while generator_gauges(server)[1] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    server.note_regions()  # an aborted server cannot be asked which /dev/shm regions it had: stop() needs them
    killed_at = time.time()
    os.kill(newest_stub(server, "codegen_generator"), signal.SIGKILL)
    deadline = time.time() + 60
    while not events_after(supervisor, killed_at, "healed", "codegen_generator") and time.time() < deadline \
            and server.process.poll() is None:
        time.sleep(0.1)
    for _ in range(8):  # Triton 2.51 may abort seconds after the kill (upstream, docs/operations.md)
        if server.process.poll() is None:
            server.note_regions()  # the healed stub's too
        time.sleep(0.25)
    aborted = server.process.poll() is not None
    if not aborted:
        assert events_after(supervisor, killed_at, "healed", "codegen_generator"), supervisor.events[-5:]
    for thread, _ in in_flight:
        thread.join(60)
    assert all(not thread.is_alive() for thread, _ in in_flight), "a request still waits for the dead generator"
    assert time.time() - killed_at < 90
    errors = [out["error"] for _, out in in_flight if "error" in out]
    assert errors, "no request was in flight at the kill"
    if aborted:
        # what `make triton`'s keeper does then (tests/test_fault_injection_server.py covers the keeper itself):
        # the server is started again, with a supervisor of its own, and must serve
        assert server.process.returncode == -signal.SIGABRT, f"tritonserver exited {server.process.returncode}"
        supervisor.stop()
        server.stop()
        server.start(timeout=300, append_log=True)
        supervisor = Supervisor(server.process.pid, server.grpc_url, Path(server.log_file).parent / "after.json",
                                metrics_url=server.metrics_url).start()
        request.addfinalizer(supervisor.stop)
    else:
        # the front's words for a call its generator lost (stage_common/bls_deadline.py, codegen_common/bls_client.py)
        lost = ("lost the request", "not healthy", "process died")
        unexpected = [e.message() for e in errors if not any(words in e.message() for words in lost)]
        assert not unexpected, (len(errors), unexpected[:3])
    answered_at = time.monotonic()
    result = unary(server.grpc_url, "def f():", 4)
    assert result.as_numpy("finish_reason").reshape(-1)[0].decode() in ("stop", "length")
    assert time.monotonic() - answered_at < 30
    deadline = time.time() + 30  # a fresh supervisor's first scan
    while not supervisor.tracker.instances("codegen_generator") and time.time() < deadline:
        time.sleep(0.2)
    assert supervisor.tracker.instances("codegen_generator") and "codegen" not in supervisor.unhealthy
