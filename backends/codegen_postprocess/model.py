import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from codegen_postprocess.detokenizer import Detokenizer  # noqa: E402
from stage_common.errors import BadInput  # noqa: E402
from stage_common.triton_io import (execute_batched, input_array, string_tensor, text_rows,  # noqa: E402
                                    version_dir)


def _parse(request):
    ids = input_array(request, "output_ids")
    if ids.ndim != 2 or ids.shape[0] != 1:
        raise BadInput(f"one sequence per request, got output_ids of shape {list(ids.shape)}")
    stop = [] if input_array(request, "stop_words", optional=True) is None else text_rows(request, "stop_words")
    return ids[0], stop


class TritonPythonModel:
    """output_ids (INT32 [-1]: generated ids, or one streamed chunk of them) [+ stop_words]
    -> text_output (TYPE_STRING [1])."""

    def initialize(self, args):
        self.detokenizer = Detokenizer(version_dir(args) / "tokenizer.json")

    def execute(self, requests):
        return execute_batched(requests, parse=_parse, compute=self.detokenizer.decode,
                               respond=lambda _parsed, text: [string_tensor("text_output", [text], (1, 1))])
