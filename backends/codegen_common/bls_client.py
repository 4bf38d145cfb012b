"""The codegen fronts' BLS calls into the generator, each with a deadline and a probe
(stage_common/bls_deadline.py says why): a call whose generator stub died fails at once instead of holding
its front's worker forever."""
from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from stage_common.bls_deadline import CallTimedOut, call_with_deadline
from stage_common.params import config_param

GENERATOR_OUTPUTS = ["output_ids", "finish_reason", "completion_tokens"]


def read_all(call, iterators: list) -> list:
    """Every response of a decoupled BLS call, read to the end of its iterator, which is kept in
    `iterators` (stage_common/bls_iterators.py: released only after the stub's cleanup)."""
    responses = call.exec(decoupled=True)
    iterators.append(responses)
    return list(responses)


class GeneratorClient:
    """generator_timeout_s: the longest wait for one call's answer (a whole unary generation, including
    its wait for a row); probe_interval_s: how often a waiting call asks whether the generator still holds
    it; probe_timeout_s: the wait for that answer (a probe unanswered proves nothing: the wait goes on)."""

    def __init__(self, model: str, config: dict):
        self.model = model
        self.timeout_s = config_param(config, "generator_timeout_s", float, 600.0)
        self.probe_every_s = config_param(config, "probe_interval_s", float, 2.0)
        self.probe_timeout_s = config_param(config, "probe_timeout_s", float, 10.0)

    def request(self, key: str, inputs: list, outputs: list[str] | None = None):
        return pb_utils.InferenceRequest(model_name=self.model, request_id=key, inputs=inputs,
                                         requested_output_names=GENERATOR_OUTPUTS if outputs is None else outputs)

    def call(self, key: str, inputs: list, iterators: list, outputs: list[str] | None = None,
             probe: bool = True, timeout_s: float | None = None) -> list:
        """Every response of one call; CallTimedOut / CallLost (UNAVAILABLE) when none comes."""
        call = self.request(key, inputs, outputs)
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        return call_with_deadline(lambda: read_all(call, iterators), self.model, timeout_s,
                                  (lambda: self.holds(key, iterators)) if probe else None, self.probe_every_s)

    def holds(self, key: str, iterators: list) -> bool:
        """False if the generator answers that it has no request `key` (or cannot answer: a dead stub)."""
        call = self.request(key, [pb_utils.Tensor("probe", np.array([[True]]))], [])
        try:
            answers = call_with_deadline(lambda: read_all(call, iterators), f"{self.model} (probe)",
                                         self.probe_timeout_s)
        except CallTimedOut:
            return True  # busy or hung: the call's own deadline (and the supervisor's canary) decide
        except Exception:  # noqa: BLE001 - e.g. "Stub process ... is not healthy": the call is gone with it
            return False
        return not any(response.has_error() for response in answers)
