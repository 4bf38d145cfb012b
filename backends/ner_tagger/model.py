import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton_python_backend_utils as pb_utils  # noqa: E402

from ner_tagger.tagger import NerTaggerRunner  # noqa: E402
from stage_common.errors import BadInput  # noqa: E402
from stage_common.torch_runtime import configure_torch  # noqa: E402
from stage_common.triton_io import execute_batched, input_array, load_model_config, version_dir  # noqa: E402

INPUTS = ("char_ids", "char_count", "token_positions", "token_count")


def _parse(request):
    inputs = {name: input_array(request, name) for name in INPUTS}
    rows = {name: a.shape[0] for name, a in inputs.items()}
    if len(set(rows.values())) != 1:
        raise BadInput(f"inputs disagree on the number of rows: {rows}")
    chars, counts = inputs["char_ids"].shape[2], inputs["char_count"]
    if counts.size and (counts.min() < 1 or counts.max() > chars):
        raise BadInput(f"char_count must be within 1..{chars}")
    if (inputs["token_positions"] < 0).any() or (inputs["token_positions"] >= chars).any():
        raise BadInput(f"token_positions must be within 0..{chars - 1}")
    tokens = inputs["token_positions"].shape[2]
    if (inputs["token_count"] < 0).any() or (inputs["token_count"] > tokens).any():
        raise BadInput(f"token_count must be within 0..{tokens}")
    return inputs


class TritonPythonModel:
    """char_ids [2, -1], char_count [2], token_positions [2, -1], token_count [1] (TYPE_INT64)
    -> emissions (TYPE_FP32 [-1, tags]); the rows of all batched requests run in one forward pass."""

    def initialize(self, args):
        config = load_model_config(args)
        device = configure_torch(args, config)
        self.runner = NerTaggerRunner(version_dir(args), device)

    def execute(self, requests):
        return execute_batched(requests, parse=_parse, compute=self.runner.emissions_per_request,
                               respond=lambda _inputs, emissions: [pb_utils.Tensor("emissions", emissions)])
