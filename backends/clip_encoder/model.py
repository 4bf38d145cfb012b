import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton_python_backend_utils as pb_utils  # noqa: E402

from clip_encoder.clip import ClipTowers, ImageRows, TextRows  # noqa: E402
from stage_common.errors import BadInput  # noqa: E402
from stage_common.torch_runtime import configure_torch  # noqa: E402
from stage_common.triton_io import execute_batched, input_array, load_model_config, version_dir  # noqa: E402


def _parse(request):
    ids = input_array(request, "input_ids", optional=True)
    pixels = input_array(request, "pixel_values", optional=True)
    if (ids is None) == (pixels is None):
        raise BadInput("send either input_ids + attention_mask (text) or pixel_values (images)")
    if pixels is not None:
        return ImageRows(pixels)
    mask = input_array(request, "attention_mask")
    if ids.shape != mask.shape:
        raise BadInput(f"input_ids {ids.shape} and attention_mask {mask.shape} differ in shape")
    if ids.size and (mask.sum(axis=1) == 0).any():
        raise BadInput("every row needs at least one token (attention_mask all zero)")
    return TextRows(ids, mask)


class TritonPythonModel:
    """One CLIPModel for both of a CLIP model's ensembles (weights loaded once):
    input_ids + attention_mask [-1] -> embedding [dim] (text features), or
    pixel_values [3, H, W] -> embedding [dim] (image features)."""

    def initialize(self, args):
        config = load_model_config(args)
        self.towers = ClipTowers(version_dir(args), configure_torch(args, config))

    def execute(self, requests):
        return execute_batched(requests, parse=_parse, compute=self.towers.encode_per_request,
                               respond=lambda _rows, features: [pb_utils.Tensor("embedding", features)])
