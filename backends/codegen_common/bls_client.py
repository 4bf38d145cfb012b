"""The codegen fronts' BLS calls into the generator, each with a deadline and a probe
(stage_common/bls_deadline.py says why): a call whose generator stub died fails at once instead of holding
its front's worker forever. The calls the front gave up on that are still blocked are published as the gauge
`bls_front_calls_stuck{model, stub_pid}`: each holds a thread of the front's Triton-side pool, and the
supervisor replaces a front that has any once the generator is healed (issue 48). A call may carry the
front's request's W3C `traceparent` as a request parameter (stage_common/tracing.py says why)."""
from __future__ import annotations

import os
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

from stage_common.bls_deadline import CallLost, CallTimedOut, RequestDeadline, StuckCalls, call_with_deadline
from stage_common.errors import StageError
from stage_common.in_flight_metric import KEPT_FAMILIES
from stage_common.params import config_param
from stage_common.supervisor_view import SupervisorView
from stage_common.tracing import TRACEPARENT

GENERATOR_OUTPUTS = ["output_ids", "finish_reason", "completion_tokens", "logprobs"]  # logprobs: when asked
STUCK_FAMILY = "bls_front_calls_stuck"  # supervisor/monitor.py reads it


# a live generator answers a probe within milliseconds, even busy: a probe of a call not yet acknowledged waits
# this long, then the next is sent (a probe to a stub that just died is never answered; the next may reach the
# stub a heal started, which answers "no" at once)
UNACKNOWLEDGED_PROBE_TIMEOUT_S = 1.0

# how Triton 2.51 fails a call into a model whose stub died (before or while the supervisor reloads it)
DEAD_STUB = "Stub process"
RESTARTING = "the generator's process died; it is being restarted: retry"


def generator_error(error) -> Exception:
    """What a front raises for a generator call answered with `error`: the generator's own refusal as it is
    (StageError keeps its code), Triton's "Stub process ... is not healthy" as CallLost (UNAVAILABLE: the
    generator is being healed, retry) rather than an internal error."""
    if DEAD_STUB in str(error.message()) and "not healthy" in str(error.message()):
        return CallLost(RESTARTING)
    return StageError(error)


def stuck_gauge(front: str):
    """This stub's count of stuck generator calls, as a gauge labelled like bls_front_requests_in_flight."""
    family = pb_utils.MetricFamily(STUCK_FAMILY, "BLS calls a front gave up on (their callee's stub died) that "
                                   "still hold a thread, per stub process", pb_utils.MetricFamily.GAUGE)
    KEPT_FAMILIES.append(family)
    return family.Metric({"model": front, "stub_pid": str(os.getpid())})


def read_all(call, iterators: list, first: threading.Event | None = None) -> list:
    """Every response of a decoupled BLS call, read to the end of its iterator, which is kept in
    `iterators` (stage_common/bls_iterators.py: released only after the stub's cleanup). `first` is set
    when the call's first response has come (exec returns then)."""
    responses = call.exec(decoupled=True)
    if first is not None:
        first.set()
    iterators.append(responses)
    return list(responses)


def is_ack(response) -> bool:
    """The generator's acknowledgement of a call (input `ack`): an empty response without an error."""
    return not response.has_error() and not response.output_tensors()


class GeneratorClient:
    """generator_timeout_s: the longest wait for one request's calls (a whole unary generation, including
    its wait for a row), shorter when the request's client set a timeout; first_response_timeout_s: the wait
    for the generator's acknowledgement of a call (it acknowledges at once when alive: issue 48);
    probe_interval_s: how often a waiting call asks whether the generator still holds it; probe_timeout_s:
    the wait for that answer (a probe unanswered proves nothing: the wait goes on)."""

    def __init__(self, model: str, config: dict, front: str | None = None):
        self.model = model
        self.timeout_s = config_param(config, "generator_timeout_s", float, 600.0)
        self.first_timeout_s = config_param(config, "first_response_timeout_s", float, 10.0)
        # false: calls go without the acknowledgement (as before issue 48): what bench/generator_ack_cost.py
        # compares against
        self.ack = config_param(config, "ack_generator_calls", bool, True)
        self.probe_every_s = config_param(config, "probe_interval_s", float, 2.0)
        self.probe_timeout_s = config_param(config, "probe_timeout_s", float, 10.0)
        self.stuck = StuckCalls(stuck_gauge(front).set if front else None)
        self.supervisor = SupervisorView.from_env()  # a generator being healed is not called (issue 48)

    def request(self, key: str, inputs: list, outputs: list[str] | None = None, traceparent: str | None = None):
        # the parameter only when there is one: an untraced request's call stays as it was
        extra = {"parameters": {TRACEPARENT: traceparent}} if traceparent else {}
        return pb_utils.InferenceRequest(model_name=self.model, request_id=key, inputs=inputs,
                                         requested_output_names=GENERATOR_OUTPUTS if outputs is None else outputs,
                                         **extra)

    def deadline(self, request) -> RequestDeadline:
        """When `request`'s client stops waiting (its Triton `timeout`), at most generator_timeout_s from now."""
        return RequestDeadline(request.timeout(), self.timeout_s)

    def call(self, key: str, inputs: list, iterators: list, outputs: list[str] | None = None,
             probe: bool = True, timeout_s: float | None = None, traceparent: str | None = None,
             ack: bool = True) -> list:
        """Every response of one call but the acknowledgement; CallTimedOut / CallLost (UNAVAILABLE) when none
        comes. `ack`: the generator is asked to acknowledge the call at once (a generation or a fetch): no answer
        in first_response_timeout_s fails it, and once acknowledged it holds no Triton-side thread of this
        front, even if the generator's stub dies under it."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        ack = ack and self.ack
        if timeout_s <= 0:
            raise CallTimedOut(f"{self.model} gave no answer before the request's deadline: retry later")
        # its stub died: a call sent now would never be answered, so it waits for the heal (seconds), within
        # the wait for an acknowledgement and the request's deadline (a stop has nothing left to stop)
        if self.supervisor.healing(self.model) and (
                not ack or not self.supervisor.wait_healed(self.model, min(timeout_s, self.first_timeout_s))):
            raise CallLost(RESTARTING)
        if ack:
            inputs = inputs + [pb_utils.Tensor("ack", np.array([[True]]))]
        call = self.request(key, inputs, outputs, traceparent)
        first = threading.Event() if ack else None

        def holds() -> bool:
            if self.supervisor.healing(self.model):  # the stub that had the call died
                return False
            # before the ack, each probe waits briefly: one sent to a stub that just died is never answered
            # (Triton queues it to the dead stub), and the next may reach the stub the heal started
            acknowledged = first is None or first.is_set()
            return self.holds(key, iterators, None if acknowledged else UNACKNOWLEDGED_PROBE_TIMEOUT_S)

        responses = call_with_deadline(lambda: read_all(call, iterators, first), self.model, timeout_s,
                                       holds if probe else None, self.probe_every_s,
                                       stuck=self.stuck, first=first,
                                       first_deadline_s=self.first_timeout_s if ack else None)
        return [r for r in responses if not is_ack(r)] if ack else responses

    def holds(self, key: str, iterators: list, timeout_s: float | None = None) -> bool:
        """False if the generator answers that it has no request `key` (or cannot answer: a dead stub); True
        if it holds it or gives no answer in `timeout_s` (default probe_timeout_s)."""
        call = self.request(key, [pb_utils.Tensor("probe", np.array([[True]]))], [])
        try:
            answers = call_with_deadline(lambda: read_all(call, iterators), f"{self.model} (probe)",
                                         self.probe_timeout_s if timeout_s is None else timeout_s, stuck=self.stuck)
        except CallTimedOut:
            return True  # busy or hung: the call's own deadline (and the supervisor's canary) decide
        except Exception:  # noqa: BLE001 - e.g. "Stub process ... is not healthy": the call is gone with it
            return False
        return not any(response.has_error() for response in answers)
