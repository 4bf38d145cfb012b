import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton_python_backend_utils as pb_utils  # noqa: E402

from ner_preprocess.preprocessing import NerPreprocessor, check_request_size  # noqa: E402
from stage_common.params import config_param  # noqa: E402
from stage_common.triton_io import execute_batched, load_model_config, text_rows, version_dir  # noqa: E402

OUTPUTS = ("char_ids", "sentence_chars", "sentence_tokens", "token_positions", "token_count", "token_offsets")


class TritonPythonModel:
    """text (TYPE_STRING [1]) -> each row's sentences (flair's splitter), their tokens and char-LM inputs:
    char_ids [2, -1], sentence_chars [-1, 2], sentence_tokens [-1], token_positions [2, -1], token_count [1],
    token_offsets [-1, 2] (all TYPE_INT64)."""

    def initialize(self, args):
        config = load_model_config(args)
        self.max_request_characters = config_param(config, "max_request_characters", int, 5000)
        self.preprocessor = NerPreprocessor(
            version_dir(args) / config_param(config, "char_lm_file", str, "char_lm.json"),
            config_param(config, "max_sentence_characters", int, 1000))

    def execute(self, requests):
        return execute_batched(
            requests,
            parse=lambda request: check_request_size(text_rows(request, "text"), self.max_request_characters),
            compute=self.preprocessor.encode_per_request,
            respond=lambda _texts, encoded: [pb_utils.Tensor(name, encoded[name]) for name in OUTPUTS],
        )
