import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton_python_backend_utils as pb_utils  # noqa: E402

from stage_common.errors import check_token_rows  # noqa: E402
from stage_common.isolation import each_alone_on_failure  # noqa: E402
from stage_common.params import config_param, runtime_params  # noqa: E402
from stage_common.triton_io import execute_batched, gpu_placement, input_array, load_model_config, version_dir  # noqa: E402
from transformer_encoder.encoder import ONNX_FILE, make_encoder, token_bounds  # noqa: E402


def _parse(request, vocab_size, max_positions):
    ids, mask = input_array(request, "input_ids"), input_array(request, "attention_mask")
    check_token_rows(ids, mask, vocab_size, max_positions)
    return ids, mask


class TritonPythonModel:
    """input_ids, attention_mask [-1] -> token_embeddings [-1, hidden] (the last hidden state)."""

    def initialize(self, args):
        config, folder = load_model_config(args), version_dir(args)
        # `runtime`: onnx (model.onnx, built and checked by `make model`) or torch
        runtime, threads = runtime_params(config, (folder / ONNX_FILE).is_file())
        self.encoder = make_encoder(folder, runtime, threads, config_param(config, "rows_per_forward", int, 8),
                                    gpu_placement(args),
                                    config_param(config, "small_batch_threads", int, 0),
                                    config_param(config, "small_batch_rows", int, 0))
        # an id outside the vocabulary or a row longer than the position embeddings would fail the whole
        # shared forward: refused per request (INVALID_ARGUMENT) before it runs
        self.vocab_size, self.max_positions = token_bounds(folder)

    def execute(self, requests):
        return execute_batched(requests, parse=lambda request: _parse(request, self.vocab_size, self.max_positions),
                               compute=lambda batch: each_alone_on_failure(self.encoder.encode_per_request, batch),
                               respond=lambda _inputs, hidden: [pb_utils.Tensor("token_embeddings", hidden)])
