import sys
import uuid
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from codegen_common.bls_client import GeneratorClient, generator_error  # noqa: E402
from codegen_common.generation_params import GenerationParams  # noqa: E402
from codegen_common.request_checks import check_rows  # noqa: E402
from stage_common.bls_deadline import RequestDeadline  # noqa: E402
from stage_common.bls_iterators import IteratorRelease  # noqa: E402
from stage_common.bounded_workers import BoundedWorkers  # noqa: E402
from stage_common.in_flight_metric import in_flight_gauge  # noqa: E402
from stage_common.errors import check_finish_reason  # noqa: E402
from stage_common.params import config_param  # noqa: E402
from stage_common.tracing import request_traceparent  # noqa: E402
from stage_common.triton_io import error_response, input_array, load_model_config, string_tensor  # noqa: E402

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
PAD = -1  # output_ids padding of the shorter rows (codegen_postprocess drops it)


class TritonPythonModel:
    """Unary front of the decoupled generator (BLS). Each row of a request (input_ids, input_lengths,
    generation_params) is its own generator request with streaming=false, all in flight at once; the
    answer has every row: output_ids (padded with -1), finish_reason, prompt_tokens, completion_tokens.
    execute only hands requests to worker threads, so a short request never waits behind a long one.
    A client's cancellation does not reach this step in Triton 2.51 (measured: polling
    request.is_cancelled() here while the generator ran never saw it), so a cancelled unary request runs
    to its end; clients that may leave use codegen_stream, whose cancellation frees the row."""

    def initialize(self, args):
        config = load_model_config(args)
        self.generator = GeneratorClient(config_param(config, "generator_model", str), config, args["model_name"])
        in_flight = config_param(config, "max_in_flight", int, 64)
        self.in_flight = in_flight_gauge(args["model_name"])  # the supervisor's "no request in flight"
        # more wait in arrival order (max_queued, kilobytes each), past it UNAVAILABLE (issue 55)
        self.workers = BoundedWorkers(in_flight, "codegen-collect", on_change=self.in_flight.set,
                                      queue=config_param(config, "max_queued", int, 0))
        # rows run on their own pool: a request thread waiting for its rows never starves them
        self.row_workers = ThreadPoolExecutor(in_flight, thread_name_prefix="codegen-collect-row")
        self.release = IteratorRelease()

    def execute(self, requests):
        for request in requests:
            try:
                self.workers.submit(self._serve, request)
            except Exception as exc:  # noqa: BLE001 - over capacity: UNAVAILABLE for this request
                request.get_response_sender().send(error_response(exc), flags=FINAL)
        return None

    def _serve(self, request):
        try:
            response = self._answer(request)
        except Exception as exc:  # noqa: BLE001 - to this client alone (a StageError as the stage said it)
            response = error_response(exc)
        request.get_response_sender().send(response, flags=FINAL)

    def _answer(self, request):
        ids, lengths = input_array(request, "input_ids"), input_array(request, "input_lengths").reshape(-1)
        params = [GenerationParams.from_json(v) for v in input_array(request, "generation_params").reshape(-1)]
        check_rows(ids.shape, lengths, len(params))  # here, before any generator call (the canary's liveness)
        iterators = []  # every row's, filled by _row
        # the generator's span joins this request's trace through a parameter (a decoupled BLS call given
        # trace= crashes Triton 2.51: stage_common/tracing.py)
        traceparent = request_traceparent(request.trace())
        deadline = self.generator.deadline(request)  # the client's timeout, if it set one
        try:
            rows = [self.row_workers.submit(self._row, ids[i, :lengths[i]], params[i], uuid.uuid4().hex, iterators,
                                            traceparent, deadline) for i in range(len(params))]
            wait(rows)  # all of them, even after a failed one: their iterators must be finished to be released
            results = [row.result() for row in rows]
        finally:
            self.release.after_cleanup(request, iterators)
        return self._response(results, lengths)

    def _row(self, ids: np.ndarray, params: GenerationParams, key: str, iterators: list, traceparent: str | None,
             deadline: RequestDeadline):
        inputs = [pb_utils.Tensor("input_ids", ids[None, :].astype(np.int32)),
                  pb_utils.Tensor("input_lengths", np.array([[ids.shape[0]]], np.int32)),
                  pb_utils.Tensor("streaming", np.array([[False]]))]
        inputs += [pb_utils.Tensor(name, array) for name, array in params.generator_arrays().items()]
        # read to the end even after an error (only a finished iterator is cleaned up), within the request's
        # deadline, failing at once if the generator no longer holds the row (its stub died: issue 35) or did
        # not take it (issue 48)
        responses = self.generator.call(key, inputs, iterators, traceparent=traceparent, timeout_s=deadline.left_s())
        chunks, reason, count, error = [], "", 0, None
        for response in responses:
            if response.has_error():
                error = response.error() if error is None else error
                continue
            out = {t.name(): t.as_numpy() for t in response.output_tensors()}
            if "output_ids" in out:
                chunks.append(out["output_ids"].reshape(-1))
            if "finish_reason" in out:
                value = out["finish_reason"].reshape(-1)[0]
                reason = (value.decode() if isinstance(value, bytes) else str(value)) or reason
            if "completion_tokens" in out:
                count = int(out["completion_tokens"].reshape(-1)[0])
        if error is not None:
            raise generator_error(error)  # the generator refused or failed the row (or its stub died)
        check_finish_reason(reason)  # "stop" or "length" only (README); a dropped row is an error
        return (np.concatenate(chunks).astype(np.int32) if chunks else np.zeros(0, np.int32)), reason, count

    @staticmethod
    def _response(results, lengths):
        width = max([len(out) for out, _, _ in results] + [0])
        output = np.full((len(results), width), PAD, np.int32)
        for i, (out, _, _) in enumerate(results):
            output[i, :len(out)] = out
        return pb_utils.InferenceResponse([
            pb_utils.Tensor("output_ids", output),
            string_tensor("finish_reason", [reason for _, reason, _ in results], (len(results), 1)),
            pb_utils.Tensor("prompt_tokens", lengths.astype(np.int32).reshape(-1, 1)),
            pb_utils.Tensor("completion_tokens", np.array([[c] for _, _, c in results], np.int32))])

    def finalize(self):
        self.workers.shutdown()
        self.row_workers.shutdown(wait=False, cancel_futures=True)
