import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from stage_common.params import config_param  # noqa: E402
from stage_common.triton_io import error_response, load_model_config  # noqa: E402

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    """Unary front of the decoupled generator (BLS): forwards each request's inputs with
    streaming=false and answers with the collected output_ids. execute only hands requests to worker
    threads, so a short request never waits behind a long one: both join the generator's batch."""

    def initialize(self, args):
        config = load_model_config(args)
        self.generator = config_param(config, "generator_model", str)
        self.inputs = [i["name"] for i in config["input"]]
        self.workers = ThreadPoolExecutor(config_param(config, "max_in_flight", int, 64),
                                          thread_name_prefix="codegen-collect")

    def execute(self, requests):
        for request in requests:
            self.workers.submit(self._serve, request)
        return None

    def _serve(self, request):
        sender = request.get_response_sender()
        try:
            inputs = [t for t in (pb_utils.get_input_tensor_by_name(request, n) for n in self.inputs) if t is not None]
            inputs.append(pb_utils.Tensor("streaming", np.array([[False]])))
            call = pb_utils.InferenceRequest(model_name=self.generator, inputs=inputs,
                                             requested_output_names=["output_ids"])
            chunks = []
            for response in call.exec(decoupled=True):
                if response.has_error():
                    error = response.error()
                    error = pb_utils.TritonError(error.message(), error.code())
                    sender.send(pb_utils.InferenceResponse(output_tensors=[], error=error), flags=FINAL)
                    return
                ids = pb_utils.get_output_tensor_by_name(response, "output_ids")
                if ids is not None:
                    chunks.append(ids.as_numpy().reshape(-1))
            output = np.concatenate(chunks).astype(np.int32) if chunks else np.zeros(0, np.int32)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("output_ids", output[None, :])]), flags=FINAL)
        except Exception as exc:  # noqa: BLE001 - reported to this request's client alone
            sender.send(error_response(exc), flags=FINAL)

    def finalize(self):
        self.workers.shutdown(wait=False, cancel_futures=True)
