import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from stage_common.params import config_param  # noqa: E402
from stage_common.triton_io import error_response, load_model_config  # noqa: E402

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# contract input -> the stage input it feeds (names of Triton's TensorRT-LLM models)
PREPROCESS_INPUTS = {"text_input": "text_input", "max_tokens": "request_output_len", "temperature": "temperature",
                     "top_k": "runtime_top_k", "top_p": "runtime_top_p", "stop_words": "stop_words"}
GENERATOR_INPUTS = {"max_tokens": "request_output_len", "temperature": "temperature", "top_k": "runtime_top_k",
                    "top_p": "runtime_top_p", "random_seed": "random_seed", "stop_words": "stop_words"}


class StageError(Exception):
    """A stage answered with an error: passed on to the client as it is."""

    def __init__(self, error):
        super().__init__(error.message())
        self.error = error


def _renamed(request, mapping: dict[str, str]) -> list:
    tensors = (pb_utils.get_input_tensor_by_name(request, name) for name in mapping)
    return [pb_utils.Tensor(mapping[t.name()], t.as_numpy()) for t in tensors if t is not None]


def _ok(response):
    if response.has_error():
        raise StageError(response.error())
    return response


class TritonPythonModel:
    """Decoupled pipeline (BLS): preprocess -> generator (streaming) -> postprocess per released chunk,
    one response per piece of text, then an empty final response. Not an ensemble because Triton 2.51
    does not pass a client's cancellation on to an ensemble step already running: here a cancelled or
    disconnected client makes the front send the generator a stop request, which frees the row."""

    def initialize(self, args):
        config = load_model_config(args)
        self.preprocess = config_param(config, "preprocess_model", str)
        self.generator = config_param(config, "generator_model", str)
        self.postprocess = config_param(config, "postprocess_model", str)
        self.workers = ThreadPoolExecutor(config_param(config, "max_in_flight", int, 64),
                                          thread_name_prefix="codegen-stream")

    def execute(self, requests):
        for request in requests:
            self.workers.submit(self._serve, request, request.get_response_sender())
        return None

    def _call(self, model: str, inputs: list, outputs: list[str]):
        return _ok(pb_utils.InferenceRequest(model_name=model, inputs=inputs, requested_output_names=outputs).exec())

    def _serve(self, request, sender):
        key, responses = uuid.uuid4().hex, None
        try:
            tokens = self._call(self.preprocess, _renamed(request, PREPROCESS_INPUTS), ["input_ids", "input_lengths"])
            stop_words = pb_utils.get_input_tensor_by_name(request, "stop_words")
            generation = pb_utils.InferenceRequest(
                model_name=self.generator, request_id=key, requested_output_names=["output_ids"],
                inputs=tokens.output_tensors() + _renamed(request, GENERATOR_INPUTS))
            responses = generation.exec(decoupled=True)
            for response in responses:
                ids = pb_utils.get_output_tensor_by_name(_ok(response), "output_ids")
                if ids is None:
                    continue
                if request.is_cancelled():
                    self._stop(key, responses)
                    break
                extra = [] if stop_words is None else [stop_words]
                piece = self._call(self.postprocess, [pb_utils.Tensor("output_ids", ids.as_numpy())] + extra,
                                   ["text_output"])
                sender.send(pb_utils.InferenceResponse(piece.output_tensors()))
            sender.send(flags=FINAL)  # a cancelled request needs it too: Triton waits for it to unload
        except StageError as exc:
            error = pb_utils.TritonError(exc.error.message(), exc.error.code())
            sender.send(pb_utils.InferenceResponse(output_tensors=[], error=error), flags=FINAL)
        except Exception as exc:  # noqa: BLE001 - reported to this request's client alone
            if responses is not None:  # e.g. the client disconnected: free its generator row
                self._stop(key, responses)
            try:
                sender.send(error_response(exc), flags=FINAL)
            except Exception:  # noqa: BLE001 - nobody left to tell
                pass

    def _stop(self, key: str, responses) -> None:
        stop = pb_utils.InferenceRequest(model_name=self.generator, request_id=key, requested_output_names=[],
                                         inputs=[pb_utils.Tensor("stop", np.array([[True]]))])
        for _ in stop.exec(decoupled=True):
            pass
        for response in responses or ():  # the generator ends the stream it was feeding
            if response.has_error():
                break

    def finalize(self):
        self.workers.shutdown(wait=False, cancel_futures=True)
