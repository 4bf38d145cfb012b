import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from codegen_common.bls_client import GeneratorClient, generator_error  # noqa: E402
from codegen_common.completion_text import CompletionTexts  # noqa: E402
from codegen_common.generation_params import GenerationParams  # noqa: E402
from stage_common.errors import BadInput, Overloaded, StageError, check_finish_reason  # noqa: E402
from stage_common.bls_deadline import CallLost, CallTimedOut, RequestDeadline, call_with_deadline  # noqa: E402
from stage_common.bls_iterators import IteratorRelease  # noqa: E402
from stage_common.bounded_workers import BoundedWorkers  # noqa: E402
from stage_common.in_flight_metric import in_flight_gauge  # noqa: E402
from stage_common.params import config_param  # noqa: E402
from stage_common.tracing import TRACEPARENT, request_traceparent  # noqa: E402
from stage_common.triton_io import error_response, load_model_config, string_tensor, version_dir  # noqa: E402

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# a stopped row ends at the generator's next step; each fetch waits for it, so a few suffice
MAX_FETCHES_AFTER_STOP = 8
# contract input -> the preprocessing input it feeds (names of Triton's TensorRT-LLM models), which
# resolves them (and NVIDIA OpenAI-frontend sampling_parameters) into one generation_params row
PREPROCESS_INPUTS = {"text_input": "text_input", "max_tokens": "request_output_len", "temperature": "temperature",
                     "top_k": "runtime_top_k", "top_p": "runtime_top_p", "random_seed": "random_seed",
                     "stop_words": "stop_words", "sampling_parameters": "sampling_parameters",
                     "exclude_input_in_output": "exclude_input_in_output", "stream": "stream",
                     "logprobs": "logprobs", "token_healing": "token_healing",
                     "input_ids": "input_ids"}  # a token-id prompt instead of text_input: passed through as it is


def _renamed(request, mapping: dict[str, str]) -> list:
    tensors = (pb_utils.get_input_tensor_by_name(request, name) for name in mapping)
    return [pb_utils.Tensor(mapping[t.name()], t.as_numpy()) for t in tensors if t is not None]


def _text(source, name: str, output: bool = False) -> bytes:
    """The one TYPE_STRING value of an input (or an output), as bytes ("" if absent)."""
    tensor = (pb_utils.get_output_tensor_by_name if output else pb_utils.get_input_tensor_by_name)(source, name)
    if tensor is None:
        return b""
    value = tensor.as_numpy().reshape(-1)[0]
    return value if isinstance(value, bytes) else str(value).encode()


def _first(responses: list, check: bool = True):
    """The one response of a decoupled BLS call (the generator answers each pulled-stream call once)."""
    first = responses[0] if responses else None
    if first is None and check:
        raise RuntimeError("the generator ended a call without a response")
    return _ok(first) if check else first


def _ok(response):
    if response.has_error():
        raise generator_error(response.error())  # a preprocessing error passes as it is too
    return response


class TritonPythonModel:
    """Decoupled pipeline (BLS): preprocess -> generator (a pulled stream: one BLS call per chunk, each
    answered once) -> each chunk decoded here, one response per piece of text with the counts, the
    last (final) one with finish_reason. Not an ensemble because Triton 2.51 does not pass a client's
    cancellation on to an ensemble step already running: here a cancelled or disconnected client makes
    the front send the generator a stop request, which frees the row."""

    def initialize(self, args):
        config = load_model_config(args)
        self.preprocess = config_param(config, "preprocess_model", str)
        # every BLS call has a deadline; a generator call also fails at once when its row was lost (issue 35)
        self.generator = GeneratorClient(config_param(config, "generator_model", str), config, args["model_name"])
        self.preprocess_timeout_s = config_param(config, "preprocess_timeout_s", float, 30.0)
        # pieces are decoded here, not by a BLS call to codegen_postprocess per piece: one hop less
        self.texts = CompletionTexts(version_dir(args) / "tokenizer.json")
        self.in_flight = in_flight_gauge(args["model_name"])  # the supervisor's "no request in flight"
        # a burst waits in arrival order (max_queued, kilobytes each), past it UNAVAILABLE (issue 55)
        self.workers = BoundedWorkers(config_param(config, "max_in_flight", int, 64), "codegen-stream",
                                      on_change=self.in_flight.set, queue=config_param(config, "max_queued", int, 0))
        self.release = IteratorRelease()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                # its deadline runs from its arrival: a wait for a thread counts against it. Its trace context
                # is read here, while Triton still holds the request's trace: once execute returns it is
                # released, and a worker's later read found none (1 sequence in 64 lost its spans under load)
                self.workers.submit(self._serve, request, sender, self.generator.deadline(request),
                                    request_traceparent(request.trace()))
            except Exception as exc:  # noqa: BLE001 - over capacity: UNAVAILABLE for this request
                sender.send(error_response(exc), flags=FINAL)
        return None

    def _call(self, model: str, inputs: list, outputs: list[str], traceparent: str | None,
              deadline: RequestDeadline):
        # never trace=request.trace(): this runs on a worker after execute returned, when Triton has released the
        # request and its trace; a BLS call given it spawns a child of freed memory (Signal 11 in
        # TRITONSERVER_ServerInferAsync: docs/observability.md, "Gaps"). The traceparent is a string the stub copied.
        extra = {"parameters": {TRACEPARENT: traceparent}} if traceparent else {}
        call = pb_utils.InferenceRequest(model_name=model, inputs=inputs, requested_output_names=outputs, **extra)
        return _ok(call_with_deadline(call.exec, model, min(self.preprocess_timeout_s, deadline.left_s())))

    def _serve(self, request, sender, waited: RequestDeadline | None = None, traceparent: str | None = None):
        if request.is_cancelled() or (waited is not None and waited.left_s() <= 0):
            # its client left, or its deadline passed, while it waited for a thread: nothing to start
            try:
                if request.is_cancelled():
                    sender.send(flags=FINAL)
                else:
                    sender.send(error_response(Overloaded("codegen_stream: the request's deadline passed while it "
                                                          "waited for a thread (max_in_flight): retry later")),
                                flags=FINAL)
            except Exception:  # noqa: BLE001 - nobody left to tell
                pass
            return
        iterators = []  # every decoupled BLS call's responses: released only after the stub's cleanup
        try:
            last = self._stream(request, sender, iterators, traceparent)
        except Exception as exc:  # noqa: BLE001 - to this client alone (a StageError as the stage said it)
            last = error_response(exc)
        try:
            self.release.after_cleanup(request, iterators)
            if last is None:  # a cancelled request needs the final flag too: Triton waits for it to unload
                sender.send(flags=FINAL)
            else:
                sender.send(last, flags=FINAL)
        except Exception:  # noqa: BLE001 - nobody left to tell
            pass

    def _stream(self, request, sender, iterators: list, traceparent: str | None = None):
        """Sends every piece but the last and returns the last response (None: a bare final flag)."""
        key = uuid.uuid4().hex
        deadline = self.generator.deadline(request)  # the client's timeout, if it set one, bounds every call
        # no BLS call here carries trace=request.trace(): they run after execute returned, when the request's
        # trace is freed (see _call). The preprocessing's call and the generation's first one carry the trace
        # context as a parameter instead (read in execute), under which each makes a span of its own
        # (stage_common/tracing.py)
        tokens = self._call(self.preprocess, _renamed(request, PREPROCESS_INPUTS),
                            ["input_ids", "input_lengths", "generation_params"], traceparent, deadline)
        ids_in = pb_utils.get_output_tensor_by_name(tokens, "input_ids").as_numpy()
        if ids_in.shape[0] != 1:
            raise BadInput(f"codegen_stream takes one prompt per request, got {ids_in.shape[0]} rows")
        params_tensor = pb_utils.get_output_tensor_by_name(tokens, "generation_params")
        params = GenerationParams.from_json(params_tensor.as_numpy().reshape(-1)[0])
        prompt_tokens = int(ids_in.shape[1])
        # a pulled stream: this call answers with the first chunk, each fetch with the next (one
        # response per BLS call: see gptj_generator/pulled_stream.py)
        call = [pb_utils.Tensor("input_ids", ids_in),
                pb_utils.Tensor("input_lengths", np.array([[prompt_tokens]], np.int32)),
                pb_utils.Tensor("pull", np.array([[True]]))] \
            + [pb_utils.Tensor(name, array) for name, array in params.generator_arrays().items()]
        prefix = "" if params.exclude_input else self._echoed(request, ids_in[0])
        answer = self.texts.start(params, ids_in[0])  # healed prefix and stop words cut, logprobs
        try:  # the traceparent goes on the generation's call only (None for fetches)
            while True:
                response = _first(self.generator.call(key, call, iterators, traceparent=traceparent,
                                                      timeout_s=deadline.left_s()))
                traceparent = None
                if request.is_cancelled():
                    self._stop(key, iterators)
                    return None
                ids = pb_utils.get_output_tensor_by_name(response, "output_ids").as_numpy().reshape(-1)
                reason = _text(response, "finish_reason", output=True).decode()
                count = pb_utils.get_output_tensor_by_name(response, "completion_tokens").as_numpy().reshape(-1)[0]
                text, logprobs = answer.piece(ids, _text(response, "logprobs", output=True), prefix)
                prefix = ""
                out = pb_utils.InferenceResponse([
                    pb_utils.Tensor("text_output", np.array([[text.encode()]], dtype=np.object_)),
                    string_tensor("finish_reason", [reason], (1, 1)),
                    pb_utils.Tensor("prompt_tokens", np.array([[prompt_tokens]], np.int32)),
                    pb_utils.Tensor("completion_tokens", np.array([[count]], np.int32))]
                    + ([string_tensor("logprobs", [logprobs], (1, 1))] if logprobs else []))
                if reason:
                    # "stop" or "length" only (README): the generator says "cancelled" when it dropped the row
                    # (a stop this front did not send, or its caller deemed gone): an error, not an end
                    check_finish_reason(reason)
                    return out
                sender.send(out)
                call = [pb_utils.Tensor("fetch", np.array([[True]]))]
        except (StageError, CallLost):  # the generator ended the stream with this error, or lost it
            raise
        except Exception:  # e.g. the client disconnected, or no answer in time: free its generator row
            self._stop(key, iterators)
            raise

    def _echoed(self, request, prompt_ids: np.ndarray) -> str:
        """The prompt as echo prepends it: the text sent, or a token-id prompt's ids spelled out (the text its
        logprobs' offsets count in)."""
        if pb_utils.get_input_tensor_by_name(request, "input_ids") is not None:
            return self.texts.spelled(prompt_ids)
        return _text(request, "text_input").decode()

    def _stop(self, key: str, iterators: list) -> None:
        """Stop the generator's row and read its stream to the (cancelled) end, so nothing is left open.
        Each call waits at most probe_timeout_s: a generator that does not answer has no row to free."""
        def call(inputs, outputs=None):
            return _first(self.generator.call(key, inputs, iterators, outputs, probe=False,
                                              timeout_s=self.generator.probe_timeout_s, ack=False), check=False)
        try:
            call([pb_utils.Tensor("stop", np.array([[True]]))], [])
            fetch = [pb_utils.Tensor("fetch", np.array([[True]]))]
            for _ in range(MAX_FETCHES_AFTER_STOP):
                response = call(fetch)
                if response is None or response.has_error() or _text(response, "finish_reason", output=True):
                    return
        except (CallTimedOut, CallLost):  # no answer, or no generator (being healed): no row to free
            return

    def finalize(self):
        self.workers.shutdown()
