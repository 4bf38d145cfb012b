import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton_python_backend_utils as pb_utils  # noqa: E402

from image_classifier.classifier import ImageClassifier  # noqa: E402
from stage_common.torch_runtime import configure_torch  # noqa: E402
from stage_common.triton_io import (execute_batched, input_array, load_model_config, string_tensor,  # noqa: E402
                                    version_dir)


class TritonPythonModel:
    """pixel_values (FP32 [3, H, W]) -> label (TYPE_STRING [1]), score (FP32 [1], its softmax probability)."""

    def initialize(self, args):
        device = configure_torch(args, load_model_config(args))
        self.classifier = ImageClassifier(version_dir(args), device)

    def execute(self, requests):
        return execute_batched(
            requests, parse=lambda request: input_array(request, "pixel_values"),
            compute=self.classifier.classify_per_request,
            respond=lambda _pixels, top1: [string_tensor("label", top1[0], (len(top1[0]), 1)),
                                           pb_utils.Tensor("score", top1[1].reshape(-1, 1))])
