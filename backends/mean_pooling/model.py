import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton_python_backend_utils as pb_utils  # noqa: E402

from mean_pooling.pooling import mean_pool_normalize  # noqa: E402
from stage_common.errors import BadInput  # noqa: E402
from stage_common.triton_io import execute_batched, input_array  # noqa: E402


def _parse(request):
    hidden, mask = input_array(request, "token_embeddings"), input_array(request, "attention_mask")
    if hidden.shape[:2] != mask.shape:
        raise BadInput(f"token_embeddings {hidden.shape} does not match attention_mask {mask.shape}")
    return hidden, mask


class TritonPythonModel:
    """token_embeddings [-1, hidden], attention_mask [-1] -> embedding [hidden], L2-normalized."""

    def initialize(self, args):
        pass

    def execute(self, requests):
        return execute_batched(requests, parse=_parse,
                               compute=lambda batch: [mean_pool_normalize(h, m) for h, m in batch],
                               respond=lambda _inputs, pooled: [pb_utils.Tensor("embedding", pooled)])
