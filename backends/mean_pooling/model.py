import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton_python_backend_utils as pb_utils  # noqa: E402

from mean_pooling.pooling import MODES, pool  # noqa: E402
from stage_common.errors import BadInput  # noqa: E402
from stage_common.params import config_param  # noqa: E402
from stage_common.triton_io import execute_batched, input_array, load_model_config  # noqa: E402


def _parse(request):
    hidden, mask = input_array(request, "token_embeddings"), input_array(request, "attention_mask")
    if hidden.shape[:2] != mask.shape:
        raise BadInput(f"token_embeddings {hidden.shape} does not match attention_mask {mask.shape}")
    return hidden, mask


class TritonPythonModel:
    """token_embeddings [-1, hidden], attention_mask [-1] -> embedding [hidden]: sentence-transformers'
    Pooling (`mode`: mean, cls, max, lasttoken; default mean), then Normalize when `normalize` (default)."""

    def initialize(self, args):
        config = load_model_config(args)
        self.mode = config_param(config, "mode", str, "mean")
        if self.mode not in MODES:
            raise ValueError(f"pooling mode {self.mode!r} is not one of {MODES}")
        self.normalize = config_param(config, "normalize", bool, True)

    def execute(self, requests):
        return execute_batched(requests, parse=_parse,
                               compute=lambda batch: [pool(h, m, self.mode, self.normalize) for h, m in batch],
                               respond=lambda _inputs, pooled: [pb_utils.Tensor("embedding", pooled)])
