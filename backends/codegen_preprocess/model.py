import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from codegen_preprocess.healing import heal_rows  # noqa: E402
from codegen_preprocess.prompt_encoder import PromptEncoder, context_window, model_vocab_size  # noqa: E402
from codegen_preprocess.row_params import RowLimits, parse_rows  # noqa: E402
from stage_common.params import config_param  # noqa: E402
from stage_common.tracing import StageTracing, traceparent_of  # noqa: E402
from stage_common.triton_io import execute_batched, load_model_config, string_tensor, version_dir  # noqa: E402


def _respond(_rows, healed: list[tuple[np.ndarray, object]]) -> list:
    """healed: (ids, resolved GenerationParams) per row (healing.heal_rows)."""
    ids_per_row = [ids for ids, _ in healed]
    width = max(ids.shape[0] for ids in ids_per_row)
    ids = np.zeros((len(ids_per_row), width), np.int32)
    for i, row in enumerate(ids_per_row):
        ids[i, :row.shape[0]] = row
    lengths = np.array([[row.shape[0]] for row in ids_per_row], np.int32)
    return [pb_utils.Tensor("input_ids", ids), pb_utils.Tensor("input_lengths", lengths),
            string_tensor("generation_params", [params.to_json() for _, params in healed], (len(healed), 1))]


class TritonPythonModel:
    """text_input (TYPE_STRING [1]) or input_ids (INT32 [-1], token ids sent as they are, right-padded with -1) per
    row, max_tokens/request_output_len, sampling inputs, stop_words, sampling_parameters (JSON),
    exclude_input_in_output, stream, logprobs, token_healing -> input_ids (INT32 [-1], right-padded with 0 to the
    longest row), input_lengths (INT32 [1]), generation_params (TYPE_STRING [1]: the row's resolved parameters,
    JSON). Every limit is checked here, before the generator. A request whose caller passes a sampled W3C
    `traceparent` parameter (codegen_stream does) gets a `codegen_preprocess.encode` span under it."""

    def initialize(self, args):
        config, folder = load_model_config(args), version_dir(args)
        self.limits = RowLimits(max_prompt_bytes=config_param(config, "max_prompt_bytes", int),
                                max_stop_words=config_param(config, "max_stop_words", int),
                                max_stop_word_chars=config_param(config, "max_stop_word_chars", int))
        self.encoder = PromptEncoder(folder / "tokenizer.json", context_window(folder / "config.json"),
                                     config_param(config, "max_tokens_limit", int),
                                     model_vocab_size(folder / "config.json"))
        self.tracing = StageTracing.from_env(args["model_name"])  # None (tracing off): no SDK, no span

    def execute(self, requests):
        spans = self._spans(requests) if self.tracing is not None else []
        try:
            return execute_batched(requests, parse=lambda r: parse_rows(r, self.limits), compute=self._encode,
                                   respond=_respond)
        finally:
            for span in spans:
                span.end()

    def _spans(self, requests) -> list:
        """One span per traced request (its caller's traceparent parameter): the whole batch's execute, which
        is that request's time here. Never a prompt or an id in it."""
        spans = []
        for request in requests:
            traceparent = traceparent_of(request.parameters())
            if traceparent is not None:
                spans.append(self.tracing.start_span(f"{self.tracing.scope}.encode", traceparent,
                                                     {"codegen.batch_requests": len(requests)}))
        return spans

    def finalize(self):
        if self.tracing is not None:
            self.tracing.close()

    def _encode(self, requests: list[list]) -> list:
        return heal_rows(requests, self.encoder.encode_rows(requests), self.encoder.tokenizer.decode)
