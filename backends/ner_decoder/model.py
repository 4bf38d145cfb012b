import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ner_decoder.decoding import NerDecoder  # noqa: E402
from stage_common.params import config_param  # noqa: E402
from stage_common.triton_io import (execute_batched, input_array, load_model_config, string_tensor,  # noqa: E402
                                    text_rows, version_dir)


def _parse(request):
    return (text_rows(request, "text"), input_array(request, "emissions"), input_array(request, "token_offsets"),
            input_array(request, "sentence_tokens"), input_array(request, "token_count"))


class TritonPythonModel:
    """text [1], emissions [-1, tags], token_offsets [-1, 2], sentence_tokens [-1], token_count [1] -> entities
    (TYPE_STRING [1]):
    a JSON array of {text, label, start, end, score} per row, offsets into the original text."""

    def initialize(self, args):
        config = load_model_config(args)
        self.decoder = NerDecoder(version_dir(args) / config_param(config, "crf_file", str, "crf.json"))

    def execute(self, requests):
        return execute_batched(
            requests, parse=_parse,
            compute=lambda batch: [self._decode(*inputs) for inputs in batch],
            respond=lambda inputs, rows: [string_tensor("entities", rows, (len(rows), 1))],
        )

    def _decode(self, texts, emissions, offsets, sentence_tokens, counts):
        try:
            return self.decoder.decode(texts, emissions, offsets, sentence_tokens, counts)
        except Exception as exc:  # noqa: BLE001 - reported to this request alone
            return exc
