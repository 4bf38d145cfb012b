import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton_python_backend_utils as pb_utils  # noqa: E402

from image_classifier.classifier import ONNX_FILE, make_classifier  # noqa: E402
from stage_common.params import runtime_params  # noqa: E402
from stage_common.triton_io import (execute_batched, gpu_placement, input_array, load_model_config,  # noqa: E402
                                    string_tensor, version_dir)


class TritonPythonModel:
    """pixel_values (FP32 [3, H, W]) -> label (TYPE_STRING [1]), score (FP32 [1], its softmax probability),
    and, when the config declares it, prompt_label: the same label as a tensor of its own for a next step
    (an ensemble output must not also feed a step: see food_captioning's config)."""

    def initialize(self, args):
        config, folder = load_model_config(args), version_dir(args)
        # `runtime`: onnx (model.onnx, built and checked by `make model`) or torch
        runtime, threads = runtime_params(config, (folder / ONNX_FILE).is_file())
        self.classifier = make_classifier(folder, runtime, threads, gpu_placement(args))
        self.label_outputs = ["label"] + [o["name"] for o in config.get("output", []) if o["name"] == "prompt_label"]

    def execute(self, requests):
        return execute_batched(
            requests, parse=lambda request: input_array(request, "pixel_values"),
            compute=self.classifier.classify_per_request,
            respond=lambda _pixels, top1: [*(string_tensor(name, top1[0], (len(top1[0]), 1))
                                             for name in self.label_outputs),
                                           pb_utils.Tensor("score", top1[1].reshape(-1, 1))])
