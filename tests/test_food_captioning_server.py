"""Live-server tier: the food_captioning ensemble through a real tritonserver, against the classifier's
own forward and BLIP's own generate on the same decoded images."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from food_images import bomb_png, encode, mixed_images, photo, truncated_jpeg
from image_preprocess.decoding import decode_image
from model_configs import MODEL_REPOSITORY
from string_tensors import string_rows
from triton_fixtures import assert_invalid_argument, concurrently

pytestmark = pytest.mark.integration

IMAGES = mixed_images()
NAMES = sorted(IMAGES)
CLASSIFIER_DIR = MODEL_REPOSITORY / "food_captioning_classifier" / "1"
CAPTIONER_DIR = MODEL_REPOSITORY / "food_captioning_captioner" / "1"
MAX_NEW_TOKENS = 20  # food_captioning_captioner's config
LIMIT = 50_000_000  # food_captioning_preprocess's max_megapixels


@pytest.fixture(scope="module")
def server(triton):
    triton.load("food_captioning")
    return triton


class Reference:
    """The HF models run directly, one image at a time, on the image as the server decodes it."""

    def __init__(self):
        import torch
        from transformers import (AutoImageProcessor, AutoModelForImageClassification, BlipForConditionalGeneration,
                                  BlipProcessor)

        torch.set_num_threads(1)
        self.torch = torch
        self.image_processor = AutoImageProcessor.from_pretrained(str(CLASSIFIER_DIR), use_fast=False)
        self.classifier = AutoModelForImageClassification.from_pretrained(str(CLASSIFIER_DIR)).eval()
        self.processor = BlipProcessor.from_pretrained(str(CAPTIONER_DIR), use_fast=False)
        self.blip = BlipForConditionalGeneration.from_pretrained(str(CAPTIONER_DIR)).eval()

    def __call__(self, data: bytes) -> tuple[str, float, str]:
        image = decode_image(data, LIMIT)
        with self.torch.inference_mode():
            pixels = self.image_processor(images=image, return_tensors="pt",
                                          input_data_format="channels_last").pixel_values
            probabilities = self.classifier(pixel_values=pixels).logits.softmax(-1)[0]
            label = self.classifier.config.id2label[int(probabilities.argmax())]
            inputs = self.processor(images=image, text=f"a photo of {label}".lower(), return_tensors="pt",
                                    input_data_format="channels_last")
            ids = self.blip.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS)[0].tolist()
        return label, float(probabilities.max()), self.processor.decode(ids, skip_special_tokens=True)


@pytest.fixture(scope="module")
def reference():
    return Reference()


@pytest.fixture(scope="module")
def expected(reference):
    return {name: reference(IMAGES[name]) for name in NAMES}


def infer(url: str, images: list[bytes]):
    result = grpcclient.InferenceServerClient(url).infer("food_captioning", [string_rows("image", images)])
    return ([v.decode() for v in result.as_numpy("label")[:, 0]], result.as_numpy("score")[:, 0],
            [v.decode() for v in result.as_numpy("caption")[:, 0]])


def assert_rows_equal(got, names, expected):
    labels, scores, captions = got
    assert len(labels) == len(scores) == len(captions) == len(names)
    for name, label, score, caption in zip(names, labels, scores, captions):
        want_label, want_score, want_caption = expected[name]
        assert label == want_label, name
        assert abs(float(score) - want_score) < 1e-5, name
        # the decoded text of BLIP's own generate ids (the stage's ids are compared token by token in
        # test_food_captioning_stages)
        assert caption == want_caption, name


def test_output_contract(server):
    labels, scores, captions = infer(server.grpc_url, [IMAGES["rgb.jpg"]])
    client = grpcclient.InferenceServerClient(server.grpc_url)
    metadata = client.get_model_metadata("food_captioning")
    assert {(t.name, t.datatype, tuple(t.shape)) for t in metadata.outputs} == {
        ("label", "BYTES", (-1, 1)), ("score", "FP32", (-1, 1)), ("caption", "BYTES", (-1, 1))}
    assert client.get_model_config("food_captioning").config.max_batch_size >= 16
    assert 0.0 < scores[0] <= 1.0 and scores.dtype == np.float32
    assert labels[0] in {"Bread", "Dairy product", "Dessert", "Egg", "Fried food", "Meat", "Noodles/Pasta", "Rice",
                         "Seafood", "Soup", "Vegetable/Fruit"}
    assert captions[0].startswith("a photo of ")


def test_batch_of_one_and_batch_of_16_mixed_formats_and_sizes(server, expected):
    assert_rows_equal(infer(server.grpc_url, [IMAGES["one_pixel.png"]]), ["one_pixel.png"], expected)
    assert len(NAMES) == 16
    assert_rows_equal(infer(server.grpc_url, [IMAGES[n] for n in NAMES]), NAMES, expected)
    assert len({expected[n][0] for n in NAMES}) >= 3, "labels follow the image"


def test_concurrent_clients_get_their_own_rows_and_stages_batch(server, expected):
    before = {m: server.stats(m) for m in ("food_captioning_classifier", "food_captioning_captioner")}
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda name: infer(server.grpc_url, [IMAGES[name]]), NAMES))
    for name, got in zip(NAMES, results):
        assert_rows_equal(got, [name], expected)
    for model, stats in before.items():
        after = server.stats(model)
        inferences = after.inference_count - stats.inference_count
        executions = after.execution_count - stats.execution_count
        assert inferences == 16, model
        assert executions < inferences, f"the dynamic batcher never grouped requests on {model}"


BAD = {
    "not an image": (b"<html>definitely not a picture</html>", "not an image"),
    "truncated jpeg": (truncated_jpeg(), "truncated"),
    "zero bytes": (b"", "zero bytes"),
    "bomb": (bomb_png(30000, 30000), "refused"),
}


def test_bad_images_fail_alone_while_batch_mates_succeed(server, expected):
    jobs = [("good", name) for name in NAMES[:12]] + [("bad", kind) for kind in BAD]
    jobs = jobs[::2] + jobs[1::2]  # interleave, so bad and good requests share batches

    results = concurrently(
        lambda job: infer(server.grpc_url, [IMAGES[job[1]] if job[0] == "good" else BAD[job[1]][0]]), jobs)
    for (kind, name), result in zip(jobs, results):
        if kind == "good":
            assert_rows_equal(result, [name], expected)
        else:
            assert_invalid_argument(result, BAD[name][1])
    assert_rows_equal(infer(server.grpc_url, [IMAGES["one_pixel.png"]]), ["one_pixel.png"], expected)


def test_megapixel_limit_message_names_the_limit(server):
    with pytest.raises(InferenceServerException, match="over the 50 megapixel limit"):
        infer(server.grpc_url, [bomb_png(10000, 6000)])
    labels, _, _ = infer(server.grpc_url, [encode(photo(33, 44, 3), "PNG")])
    assert len(labels) == 1
