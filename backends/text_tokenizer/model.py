import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton_python_backend_utils as pb_utils  # noqa: E402

from stage_common.params import config_param  # noqa: E402
from stage_common.triton_io import execute_batched, load_model_config, text_rows, version_dir  # noqa: E402
from text_tokenizer.tokenization import TextTokenizer  # noqa: E402


class TritonPythonModel:
    """text (TYPE_STRING [1]) -> input_ids, attention_mask (TYPE_INT64 [-1])."""

    def initialize(self, args):
        config = load_model_config(args)
        self.tokenizer = TextTokenizer(version_dir(args) / config_param(config, "tokenizer_file", str, "tokenizer.json"),
                                       config_param(config, "max_length", int))
        self.max_text_bytes = config_param(config, "max_text_bytes", int, 100_000)

    def execute(self, requests):
        return execute_batched(
            requests,
            parse=lambda request: text_rows(request, "text", self.max_text_bytes, "model parameter max_text_bytes"),
            compute=self.tokenizer.encode_per_request,
            respond=lambda _texts, encoded: [pb_utils.Tensor("input_ids", encoded[0]),
                                             pb_utils.Tensor("attention_mask", encoded[1])],
        )
