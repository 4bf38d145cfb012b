import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton_python_backend_utils as pb_utils  # noqa: E402

from clip_encoder.clip import ImageRows, TextRows, has_onnx, make_towers, text_token_bounds  # noqa: E402
from stage_common.errors import BadInput, check_token_rows  # noqa: E402
from stage_common.isolation import each_alone_on_failure  # noqa: E402
from stage_common.params import runtime_params  # noqa: E402
from stage_common.triton_io import execute_batched, gpu_placement, input_array, load_model_config, version_dir  # noqa: E402


def _parse(request, image_shape, token_bounds):
    ids = input_array(request, "input_ids", optional=True)
    pixels = input_array(request, "pixel_values", optional=True)
    if (ids is None) == (pixels is None):
        raise BadInput("send either input_ids + attention_mask (text) or pixel_values (images)")
    if pixels is not None:
        if tuple(pixels.shape[1:]) != tuple(image_shape):
            raise BadInput(f"pixel_values rows are {list(pixels.shape[1:])}; this CLIP takes {list(image_shape)}")
        return ImageRows(pixels)
    mask = input_array(request, "attention_mask")
    check_token_rows(ids, mask, *token_bounds)
    return TextRows(ids, mask)


class TritonPythonModel:
    """One CLIP model for both of a CLIP model's ensembles (weights loaded once):
    input_ids + attention_mask [-1] -> embedding [dim] (text features), or
    pixel_values [3, H, W] -> embedding [dim] (image features)."""

    def initialize(self, args):
        config, folder = load_model_config(args), version_dir(args)
        # `runtime`: onnx (text.onnx + image.onnx, exported and checked by the gateway at registration)
        # or torch (the transformers CLIPModel folder)
        runtime, threads = runtime_params(config, has_onnx(folder))
        self.towers = make_towers(folder, runtime, threads, gpu_placement(args))
        # ids outside the vocabulary, or rows longer than the position embeddings, are refused per request
        self.token_bounds = text_token_bounds(folder)

    def execute(self, requests):
        return execute_batched(requests, parse=lambda request: _parse(request, self.towers.image_shape, self.token_bounds),
                               compute=lambda batch: each_alone_on_failure(self.towers.encode_per_request, batch),
                               respond=lambda _rows, features: [pb_utils.Tensor("embedding", features)])
