import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from blip_captioner.captioner import has_onnx, make_captioner  # noqa: E402
from stage_common.errors import BadInput  # noqa: E402
from stage_common.params import config_param, runtime_params  # noqa: E402
from stage_common.triton_io import (execute_batched, gpu_placement, input_array, load_model_config,  # noqa: E402
                                    string_tensor, text_rows, version_dir)


def _parse(request, image_shape):
    pixels, labels = input_array(request, "pixel_values"), text_rows(request, "label")
    if len(pixels) != len(labels):
        raise BadInput(f"{len(pixels)} images but {len(labels)} labels")
    if pixels.shape[1:] != image_shape:
        raise BadInput(f"pixel_values rows are {list(pixels.shape[1:])}; this BLIP takes {list(image_shape)}")
    return pixels, labels


class TritonPythonModel:
    """pixel_values (FP32 [3, H, W]) + label (TYPE_STRING [1]) -> caption (TYPE_STRING [1]):
    BLIP generate prompted with `prompt_template` filled with the label, lower-cased."""

    def initialize(self, args):
        config, folder = load_model_config(args), version_dir(args)
        # `runtime`: onnx (vision.onnx + decoder.onnx, built and checked by `make model`) or torch
        runtime, threads = runtime_params(config, has_onnx(folder))
        self.captioner = make_captioner(
            folder, runtime, threads, gpu_placement(args),
            prompt_template=config_param(config, "prompt_template", str, "a photo of {label}"),
            max_new_tokens=config_param(config, "max_new_tokens", int, 20),
            num_beams=config_param(config, "num_beams", int, 1))

    def execute(self, requests):
        return execute_batched(
            requests, parse=lambda request: _parse(request, self.captioner.image_shape),
            compute=self.captioner.caption_per_request,
            respond=lambda _inputs, captions: [string_tensor("caption", captions, (len(captions), 1))])
