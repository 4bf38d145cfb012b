import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton_python_backend_utils as pb_utils  # noqa: E402

from ner_tagger.rows import Bounds, sentence_rows  # noqa: E402
from ner_tagger.runtimes import has_onnx, make_tagger  # noqa: E402
from stage_common.isolation import each_alone_on_failure  # noqa: E402
from stage_common.params import config_param, runtime_params  # noqa: E402
from stage_common.triton_io import (execute_batched, gpu_placement, input_array, load_model_config,  # noqa: E402
                                    version_dir)

INPUTS = ("char_ids", "sentence_chars", "sentence_tokens", "token_positions", "token_count")


class TritonPythonModel:
    """char_ids [2, -1], sentence_chars [-1, 2], sentence_tokens [-1], token_positions [2, -1], token_count [1]
    (TYPE_INT64) -> emissions (TYPE_FP32 [-1, tags]); every sentence of every batched request is a row of
    the same forward passes."""

    def initialize(self, args):
        config, folder = load_model_config(args), version_dir(args)
        # `runtime`: onnx (the graphs `make model` wrote and checked against torch) or torch
        self.runner = make_tagger(folder, *runtime_params(config, has_onnx(folder)), gpu_placement(args))
        self.chars_per_forward = config_param(config, "chars_per_forward", int, 16000)
        self.bounds = Bounds(config_param(config, "max_request_lm_characters", int, 15000),
                             config_param(config, "max_sentence_lm_characters", int, 2001))

    def _parse(self, request):
        return sentence_rows(*(input_array(request, name) for name in INPUTS), self.bounds)

    def execute(self, requests):
        return execute_batched(
            requests, parse=self._parse,
            compute=self._emissions,
            respond=lambda _inputs, emissions: [pb_utils.Tensor("emissions", emissions)])

    def _emissions(self, batch):
        return each_alone_on_failure(lambda rows: self.runner.emissions_per_request(rows, self.chars_per_forward), batch)
