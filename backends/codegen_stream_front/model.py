import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from gptj_generator.generation_params import GenerationParams  # noqa: E402
from stage_common.errors import BadInput  # noqa: E402
from stage_common.bls_iterators import IteratorRelease  # noqa: E402
from stage_common.bounded_workers import BoundedWorkers  # noqa: E402
from stage_common.params import config_param  # noqa: E402
from stage_common.triton_io import error_response, load_model_config, string_tensor  # noqa: E402

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# contract input -> the preprocessing input it feeds (names of Triton's TensorRT-LLM models), which
# resolves them (and NVIDIA OpenAI-frontend sampling_parameters) into one generation_params row
PREPROCESS_INPUTS = {"text_input": "text_input", "max_tokens": "request_output_len", "temperature": "temperature",
                     "top_k": "runtime_top_k", "top_p": "runtime_top_p", "random_seed": "random_seed",
                     "stop_words": "stop_words", "sampling_parameters": "sampling_parameters",
                     "exclude_input_in_output": "exclude_input_in_output", "stream": "stream"}


class StageError(Exception):
    """A stage answered with an error: passed on to the client as it is."""

    def __init__(self, error):
        super().__init__(error.message())
        self.error = error


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


def _ok(response):
    if response.has_error():
        raise StageError(response.error())
    return response


class TritonPythonModel:
    """Decoupled pipeline (BLS): preprocess -> generator (streaming) -> postprocess per released chunk,
    one response per piece of text with the counts, the last (final) one with finish_reason. Not an
    ensemble because Triton 2.51 does not pass a client's cancellation on to an ensemble step already running: here a cancelled or
    disconnected client makes the front send the generator a stop request, which frees the row."""

    def initialize(self, args):
        config = load_model_config(args)
        self.preprocess = config_param(config, "preprocess_model", str)
        self.generator = config_param(config, "generator_model", str)
        self.postprocess = config_param(config, "postprocess_model", str)
        self.workers = BoundedWorkers(config_param(config, "max_in_flight", int, 64), "codegen-stream")
        self.release = IteratorRelease()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self.workers.submit(self._serve, request, sender)
            except Exception as exc:  # noqa: BLE001 - over capacity: UNAVAILABLE for this request
                sender.send(error_response(exc), flags=FINAL)
        return None

    def _call(self, model: str, inputs: list, outputs: list[str]):
        return _ok(pb_utils.InferenceRequest(model_name=model, inputs=inputs, requested_output_names=outputs).exec())

    def _serve(self, request, sender):
        iterators = []  # every decoupled BLS call's responses: released only after the stub's cleanup
        try:
            last = self._stream(request, sender, iterators)
        except StageError as exc:
            last = pb_utils.InferenceResponse(output_tensors=[],
                                              error=pb_utils.TritonError(exc.error.message(), exc.error.code()))
        except Exception as exc:  # noqa: BLE001 - reported to this request's client alone
            last = error_response(exc)
        try:
            self.release.after_cleanup(request, iterators)
            if last is None:  # a cancelled request needs the final flag too: Triton waits for it to unload
                sender.send(flags=FINAL)
            else:
                sender.send(last, flags=FINAL)
        except Exception:  # noqa: BLE001 - nobody left to tell
            pass

    def _stream(self, request, sender, iterators: list):
        """Sends every piece but the last and returns the last response (None: a bare final flag)."""
        key = uuid.uuid4().hex
        tokens = self._call(self.preprocess, _renamed(request, PREPROCESS_INPUTS),
                            ["input_ids", "input_lengths", "generation_params"])
        ids_in = pb_utils.get_output_tensor_by_name(tokens, "input_ids").as_numpy()
        if ids_in.shape[0] != 1:
            raise BadInput(f"codegen_stream takes one prompt per request, got {ids_in.shape[0]} rows")
        params_tensor = pb_utils.get_output_tensor_by_name(tokens, "generation_params")
        params = GenerationParams.from_json(params_tensor.as_numpy().reshape(-1)[0])
        prompt_tokens = int(ids_in.shape[1])
        generation = pb_utils.InferenceRequest(
            model_name=self.generator, request_id=key,
            requested_output_names=["output_ids", "finish_reason", "completion_tokens"],
            inputs=[pb_utils.Tensor("input_ids", ids_in),
                    pb_utils.Tensor("input_lengths", np.array([[prompt_tokens]], np.int32))]
            + [pb_utils.Tensor(name, array) for name, array in params.generator_arrays().items()])
        prefix = b"" if params.exclude_input else _text(request, "text_input")
        responses = generation.exec(decoupled=True)
        iterators.append(responses)
        try:
            for response in responses:
                ids = pb_utils.get_output_tensor_by_name(_ok(response), "output_ids")
                if ids is None:
                    continue
                if request.is_cancelled():
                    self._stop(key, responses, iterators)
                    return None
                reason = _text(response, "finish_reason", output=True).decode()
                count = pb_utils.get_output_tensor_by_name(response, "completion_tokens").as_numpy().reshape(-1)[0]
                piece = self._call(self.postprocess, [pb_utils.Tensor("output_ids", ids.as_numpy()), params_tensor],
                                   ["text_output"])
                text = pb_utils.get_output_tensor_by_name(piece, "text_output").as_numpy().reshape(-1)[0]
                text, prefix = prefix + text, b""
                finished = reason in ("stop", "length")
                out = pb_utils.InferenceResponse([
                    pb_utils.Tensor("text_output", np.array([[text]], dtype=np.object_)),
                    string_tensor("finish_reason", [reason if finished else ""], (1, 1)),
                    pb_utils.Tensor("prompt_tokens", np.array([[prompt_tokens]], np.int32)),
                    pb_utils.Tensor("completion_tokens", np.array([[count]], np.int32))])
                if finished:
                    self._drain(responses)
                    return out
                sender.send(out)
        except StageError:
            self._drain(responses)
            raise
        except Exception:  # e.g. the client disconnected: free its generator row
            self._stop(key, responses, iterators)
            raise
        return None

    @staticmethod
    def _drain(responses) -> None:
        """Read a generator stream to its end (only a finished iterator is cleaned up by the stub)."""
        for _ in responses:
            pass

    def _stop(self, key: str, responses, iterators: list) -> None:
        stop = pb_utils.InferenceRequest(model_name=self.generator, request_id=key, requested_output_names=[],
                                         inputs=[pb_utils.Tensor("stop", np.array([[True]]))])
        acknowledged = stop.exec(decoupled=True)
        iterators.append(acknowledged)
        self._drain(acknowledged)
        for response in responses:  # the generator ends the stream it was feeding
            if response.has_error():
                break
        self._drain(responses)

    def finalize(self):
        self.workers.shutdown()
