import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from codegen_preprocess.prompt_encoder import PromptEncoder, PromptRequest, context_window  # noqa: E402
from gptj_generator.request_inputs import scalar_input, stop_words_input  # noqa: E402
from stage_common.errors import BadInput  # noqa: E402
from stage_common.params import config_param  # noqa: E402
from stage_common.triton_io import execute_batched, load_model_config, text_rows, version_dir  # noqa: E402


def _parse(request) -> PromptRequest:
    rows = text_rows(request, "text_input")
    if len(rows) != 1:
        raise BadInput(f"send one prompt per request, got {len(rows)}")
    stop_words_input(request)  # only checked here (valid UTF-8); the generator uses them
    return PromptRequest(rows[0], int(scalar_input(request, "request_output_len", required=True)),
                         temperature=float(scalar_input(request, "temperature", 0.0)),
                         top_k=int(scalar_input(request, "runtime_top_k", 0)),
                         top_p=float(scalar_input(request, "runtime_top_p", 1.0))).check()


def _respond(_request, ids: np.ndarray) -> list:
    return [pb_utils.Tensor("input_ids", ids[None, :]),
            pb_utils.Tensor("input_lengths", np.array([[ids.shape[0]]], dtype=np.int32))]


class TritonPythonModel:
    """text_input (TYPE_STRING [1]), request_output_len [+ sampling inputs, stop_words, all only
    checked here] -> input_ids (INT32 [-1]), input_lengths (INT32 [1])."""

    def initialize(self, args):
        config, folder = load_model_config(args), version_dir(args)
        self.encoder = PromptEncoder(folder / "tokenizer.json", context_window(folder / "config.json"),
                                     config_param(config, "max_tokens_limit", int))

    def execute(self, requests):
        return execute_batched(requests, parse=_parse, compute=self.encoder.encode, respond=_respond)
