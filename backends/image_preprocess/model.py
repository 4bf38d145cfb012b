import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton_python_backend_utils as pb_utils  # noqa: E402

from image_preprocess.preprocess import FoodImagePreprocessor, SingleImagePreprocessor  # noqa: E402
from stage_common.errors import BadInput, check_limit  # noqa: E402
from stage_common.params import config_param  # noqa: E402
from stage_common.triton_io import execute_batched, input_array, load_model_config, version_dir  # noqa: E402


def _image_rows(request, max_bytes: int) -> list[bytes]:
    rows = input_array(request, "image").reshape(-1)
    if any(not isinstance(row, bytes) for row in rows):
        raise BadInput("'image' must hold encoded image bytes")
    for i, row in enumerate(rows):  # before any decoding
        check_limit(len(row), max_bytes, f"the size of 'image' row {i} (bytes)", "model parameter max_image_bytes")
    return list(rows)


class TritonPythonModel:
    """image (TYPE_STRING [1], encoded bytes) -> with a `processor_file` parameter: pixel_values (one
    model's processor); otherwise classifier_pixel_values, captioner_pixel_values (FP32 [3, H, W])."""

    def initialize(self, args):
        config, folder = load_model_config(args), version_dir(args)
        self.max_image_bytes = config_param(config, "max_image_bytes", int, 20_000_000)
        single = config_param(config, "processor_file", str, "")
        if single:
            self.preprocess = SingleImagePreprocessor(folder / single, config_param(config, "max_megapixels", float, 50.0))
            self.outputs = ("pixel_values",)
            return
        self.outputs = ("classifier_pixel_values", "captioner_pixel_values")
        self.preprocess = FoodImagePreprocessor(
            folder / config_param(config, "classifier_processor_file", str, "classifier_preprocessor_config.json"),
            folder / config_param(config, "captioner_processor_file", str, "blip_preprocessor_config.json"),
            config_param(config, "max_megapixels", float, 50.0))

    def execute(self, requests):
        # Decoding happens in parse: an undecodable image fails its own request only.
        return execute_batched(
            requests, parse=lambda request: self.preprocess(_image_rows(request, self.max_image_bytes)), compute=lambda batch: batch,
            respond=lambda pixels, _same: self._tensors(pixels))

    def _tensors(self, pixels):
        if len(self.outputs) == 1:
            return [pb_utils.Tensor(self.outputs[0], pixels)]
        return [pb_utils.Tensor(name, values) for name, values in zip(self.outputs, pixels)]
