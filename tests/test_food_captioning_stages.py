"""Unit tier: the food_captioning stages without a server, against Pillow and the HF processors/models."""
from __future__ import annotations

import io
import json
import resource
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from google.protobuf import json_format
from PIL import Image, ImageOps

import fake_pb_utils as pb
from food_images import (animated_gif, bomb_png, encode, exif_rotated_jpeg, mixed_images, palette_png_with_transparency,
                         photo, sixteen_bit_png, truncated_jpeg)
from image_preprocess.decoding import decode_image
from image_preprocess.processors import ImageProcessor
from model_configs import MODEL_REPOSITORY, load_python_model, parse_config
from stage_common.errors import BadInput

LIMIT = 50_000_000
IMAGES = mixed_images()
CLASSIFIER_DIR = MODEL_REPOSITORY / "food_captioning_classifier" / "1"
CAPTIONER_DIR = MODEL_REPOSITORY / "food_captioning_captioner" / "1"
MAX_NEW_TOKENS = 20  # food_captioning_captioner's config


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    torch.set_num_threads(1)


def decoded(name: str) -> Image.Image:
    return decode_image(IMAGES[name], LIMIT)


# ---- decoding ----

@pytest.mark.parametrize("name", sorted(IMAGES))
def test_every_format_and_mode_decodes_to_rgb(name):
    original = Image.open(io.BytesIO(IMAGES[name]))
    image = decoded(name)
    assert image.mode == "RGB"
    expected = original.size[::-1] if name.startswith("exif6") else original.size
    assert image.size == expected


def test_exif_orientation_is_applied():
    data = exif_rotated_jpeg(photo(320, 200, 8), orientation=6)
    stored = Image.open(io.BytesIO(data))
    image = decode_image(data, LIMIT)
    assert image.size == (200, 320)
    np.testing.assert_array_equal(np.asarray(image), np.asarray(stored.transpose(Image.Transpose.ROTATE_270)))
    np.testing.assert_array_equal(np.asarray(image), np.asarray(ImageOps.exif_transpose(stored)))


def test_cmyk_is_converted_by_pillow():
    data = encode(photo(60, 40, 3).convert("CMYK"), "JPEG")
    np.testing.assert_array_equal(np.asarray(decode_image(data, LIMIT)),
                                  np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))


def test_sixteen_bit_keeps_the_high_byte():
    data = sixteen_bit_png(64, 48)
    raw = np.asarray(Image.open(io.BytesIO(data))).astype(np.uint16)
    pixels = np.asarray(decode_image(data, LIMIT))
    for channel in range(3):
        np.testing.assert_array_equal(pixels[..., channel], raw >> 8)
    assert pixels.max() > 200, "the full 16-bit range maps onto 0..255, not clipped at 255"


def test_transparent_pixels_are_white():
    clear = encode(Image.new("RGBA", (8, 8), (10, 20, 30, 0)), "PNG")
    assert (np.asarray(decode_image(clear, LIMIT)) == 255).all()
    data = palette_png_with_transparency(160, 100)
    indices = np.asarray(Image.open(io.BytesIO(data)))
    pixels = np.asarray(decode_image(data, LIMIT))
    assert (indices == 0).any()
    assert (pixels[indices == 0] == 255).all()


def test_animated_gif_uses_the_first_frame():
    pixels = np.asarray(decode_image(animated_gif(90, 60), LIMIT))
    assert (pixels == [200, 30, 30]).all()


def test_one_pixel_image_is_valid():
    assert np.asarray(decode_image(IMAGES["one_pixel.png"], LIMIT)).tolist() == [[[10, 200, 30]]]


@pytest.mark.parametrize("data, message", [
    (b"", "zero bytes"),
    (b"this is not an image at all", "not an image"),
    (b"\x89PNG\r\n\x1a\n", "not an image"),
    (truncated_jpeg(), "truncated"),
])
def test_broken_bytes_are_bad_input(data, message):
    with pytest.raises(BadInput, match=message):
        decode_image(data, LIMIT)


def test_decompression_bomb_is_refused_fast_without_decoding():
    bomb = bomb_png(30000, 30000)  # 900 megapixels: ~2.7 GB decoded
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    with pytest.raises(BadInput, match="refused"):
        decode_image(bomb, LIMIT)
    assert time.monotonic() - start < 2.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before < 100_000  # KiB


def test_megapixel_limit_is_configurable():
    data = bomb_png(3000, 2000)  # 6 MP
    with pytest.raises(BadInput, match="3000x2000 = 6.0 megapixels, over the 5 megapixel limit"):
        decode_image(data, 5_000_000)
    assert decode_image(data, 6_000_000).size == (3000, 2000)


def test_extreme_aspect_ratio_is_refused_before_resizing():
    processor = ImageProcessor.from_file(
        MODEL_REPOSITORY / "food_captioning_preprocess" / "1" / "classifier_preprocessor_config.json", LIMIT)
    with pytest.raises(BadInput, match="aspect ratio"):
        processor(decode_image(bomb_png(1, 40000), LIMIT))  # would be resized to 256 x 10 million


# ---- pixel values equal the HF image processors' ----

def hf_processors():
    from transformers import (AutoImageProcessor, BlipImageProcessor, ConvNextImageProcessor,
                              MobileNetV2ImageProcessor, ViTImageProcessor)

    return {
        "built classifier": AutoImageProcessor.from_pretrained(str(CLASSIFIER_DIR), use_fast=False),
        "built blip": BlipImageProcessor.from_pretrained(str(CAPTIONER_DIR)),
        "blip 384 (hub)": BlipImageProcessor(),
        "vit": ViTImageProcessor(),
        "convnext 384": ConvNextImageProcessor(size={"shortest_edge": 384}),
        "mobilenet_v2": MobileNetV2ImageProcessor(),
    }


@pytest.mark.parametrize("kind", list(hf_processors()))
def test_pixel_values_equal_hf_image_processor(kind):
    hf = hf_processors()[kind]
    ours = ImageProcessor(hf.to_dict(), LIMIT)
    for name in IMAGES:
        image = decoded(name)
        # channels_last: HF would otherwise guess 1x1 and 3-pixel-high images as channels-first
        expected = hf(images=image, return_tensors="np", input_data_format="channels_last").pixel_values[0]
        actual = ours(image)
        assert actual.dtype == np.float32 and actual.shape == expected.shape, name
        np.testing.assert_array_equal(actual, expected, err_msg=name)


def test_unsupported_image_processor_is_refused_at_load():
    with pytest.raises(ValueError, match="not reproduced"):
        ImageProcessor({"image_processor_type": "DetrImageProcessor"}, LIMIT)


# ---- the model.py files, in-process ----

@pytest.fixture(scope="module")
def preprocess():
    return load_python_model("food_captioning_preprocess")


@pytest.fixture(scope="module")
def classifier():
    return load_python_model("food_captioning_classifier")


@pytest.fixture(scope="module")
def captioner():
    return load_python_model("food_captioning_captioner")


def image_request(*images: bytes):
    return pb.InferenceRequest({"image": np.array([[data] for data in images], dtype=object)})


def test_preprocess_fails_only_the_bad_requests(preprocess):
    bad = [b"", b"garbage bytes", truncated_jpeg(), bomb_png(30000, 30000)]
    good = [IMAGES["rgb.jpg"], IMAGES["one_pixel.png"]]
    responses = preprocess.execute([image_request(good[0]), *[image_request(b) for b in bad],
                                    image_request(*good)])
    for response in responses[1:-1]:
        assert response.has_error() and response.error().code() == pb.TritonError.INVALID_ARG
        assert "internal" not in response.error().message()
    first, batch = responses[0], responses[-1]
    assert not first.has_error() and not batch.has_error()
    assert first.output("classifier_pixel_values").shape == (1, 3, 224, 224)
    assert batch.output("captioner_pixel_values").shape == (2, 3, 64, 64)
    np.testing.assert_array_equal(batch.output("captioner_pixel_values")[0],
                                  first.output("captioner_pixel_values")[0])


def test_image_over_max_image_bytes_is_refused_before_decoding(preprocess):
    assert preprocess.max_image_bytes == 20_000_000
    oversized = IMAGES["rgb.jpg"] + b"\0" * 20_000_000  # a valid JPEG with trailing bytes: never parsed
    ok, refused, also_ok = preprocess.execute([image_request(IMAGES["rgb.jpg"]),
                                               image_request(IMAGES["one_pixel.png"], oversized),
                                               image_request(IMAGES["one_pixel.png"])])
    assert not ok.has_error() and not also_ok.has_error()
    assert refused.error().code() == pb.TritonError.INVALID_ARG
    assert refused.error().message() == (f"the size of 'image' row 1 (bytes) is {len(oversized)}, over the limit of "
                                         "20000000 (model parameter max_image_bytes)")


def test_preprocess_rejects_non_bytes_rows(preprocess):
    (response,) = preprocess.execute([pb.InferenceRequest({"image": np.array([[1.5]], dtype=object)})])
    assert response.error().code() == pb.TritonError.INVALID_ARG


@pytest.fixture(scope="module")
def reference_classifier():
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    return (AutoImageProcessor.from_pretrained(str(CLASSIFIER_DIR), use_fast=False),
            AutoModelForImageClassification.from_pretrained(str(CLASSIFIER_DIR)).eval())


def reference_top1(reference, image: Image.Image) -> tuple[str, float]:
    processor, model = reference
    with torch.inference_mode():
        pixels = processor(images=image, return_tensors="pt", input_data_format="channels_last").pixel_values
        probabilities = model(pixel_values=pixels).logits.softmax(-1)[0]
    return model.config.id2label[int(probabilities.argmax())], float(probabilities.max())


def test_classifier_equals_its_own_forward_and_varies(preprocess, classifier, reference_classifier):
    names = sorted(IMAGES)
    pixels = [preprocess.execute([image_request(IMAGES[n])])[0].output("classifier_pixel_values") for n in names]
    responses = classifier.execute([pb.InferenceRequest({"pixel_values": p}) for p in pixels])
    labels = set()
    for name, response in zip(names, responses):
        label, score = response.output("label")[0, 0].decode(), response.output("score")[0, 0]
        expected_label, expected_score = reference_top1(reference_classifier, decoded(name))
        assert label == expected_label, name
        assert abs(score - expected_score) < 1e-4, name  # ONNX Runtime as shipped: logits within 1e-4
        # the captioner's copy of the label (food_captioning's config: an ensemble output must not feed a step)
        assert response.output("prompt_label")[0, 0].decode() == label, name
        labels.add(label)
    assert len(labels) >= 3, f"the demo classifier's prediction should follow the image: {labels}"


@pytest.mark.parametrize("runtime", ["onnx", "torch"])
def test_both_classifier_runtimes_equal_transformers(preprocess, reference_classifier, runtime):
    """ONNX Runtime over model.onnx (what the stage runs when it exists) and torch over the folder."""
    from image_classifier.classifier import make_classifier

    classifier = make_classifier(CLASSIFIER_DIR, runtime, threads=1)
    names = sorted(IMAGES)
    pixels = np.concatenate([preprocess.execute([image_request(IMAGES[n])])[0].output("classifier_pixel_values")
                             for n in names])
    labels, scores = classifier.top1(pixels)
    for name, label, score in zip(names, labels, scores):
        expected_label, expected_score = reference_top1(reference_classifier, decoded(name))
        assert label == expected_label, name
        assert abs(score - expected_score) < (1e-5 if runtime == "torch" else 1e-4), name
    assert scores.dtype == np.float32


@pytest.fixture(scope="module")
def reference_blip():
    from transformers import BlipForConditionalGeneration, BlipProcessor

    return (BlipProcessor.from_pretrained(str(CAPTIONER_DIR), use_fast=False),
            BlipForConditionalGeneration.from_pretrained(str(CAPTIONER_DIR)).eval())


def reference_ids(reference, image: Image.Image, label: str) -> list[int]:
    processor, model = reference
    inputs = processor(images=image, text=f"a photo of {label}".lower(), return_tensors="pt",
                       input_data_format="channels_last")
    with torch.inference_mode():
        return model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS)[0].tolist()


def blip_images(names: list[str]) -> list[np.ndarray]:
    processor = ImageProcessor.from_file(CAPTIONER_DIR / "preprocessor_config.json", LIMIT)
    return [processor(decoded(n)) for n in names]


def test_shipped_captioner_runs_onnx(captioner):
    from blip_captioner.onnx_blip import OnnxBlip

    assert isinstance(captioner.captioner.generator, OnnxBlip)


@pytest.mark.parametrize("runtime", ["onnx", "torch"])
def test_batched_generation_equals_one_image_at_a_time_token_for_token(reference_blip, runtime):
    """ONNX Runtime (vision.onnx, decoder.onnx with its cache, the numpy greedy loop, tokenizer.json) and
    torch, over a batch mixing prompts of three token lengths, against a lone transformers generate each."""
    from blip_captioner.captioner import make_captioner

    stage = make_captioner(CAPTIONER_DIR, runtime, threads=1, max_new_tokens=MAX_NEW_TOKENS)
    names = sorted(IMAGES)
    labels = ["Bread", "Noodles/Pasta", "Dairy product", "Egg"] * 4  # groups of 4 share a prompt
    images = blip_images(names)
    generated = stage.generate_ids(images, labels)
    expected = [reference_ids(reference_blip, decoded(n), label) for n, label in zip(names, labels)]
    assert generated == expected
    captions = stage.caption(images, labels)
    processor = reference_blip[0]
    assert captions == [processor.decode(ids, skip_special_tokens=True) for ids in expected]
    assert len(set(captions)) > 4, "captions follow the image, not only the prompt"
    prompts = [processor.decode(processor.tokenizer(f"a photo of {label}".lower()).input_ids, skip_special_tokens=True)
               for label in labels]
    assert all(c.startswith(p) and len(c) > len(p) for c, p in zip(captions, prompts))


@pytest.mark.parametrize("runtime", ["onnx", "torch"])
def test_rows_ending_early_equal_transformers(reference_blip, runtime):
    """The random demo BLIP never emits [SEP] within 20 tokens: a token it does emit for some images
    stands in as the end token (in the reference model too), so rows end mid-batch and are padded."""
    from blip_captioner.captioner import make_captioner

    names, labels = sorted(IMAGES)[:8], ["Rice"] * 8
    stage = make_captioner(CAPTIONER_DIR, runtime, threads=1, max_new_tokens=MAX_NEW_TOKENS)
    images = blip_images(names)
    free = stage.generate_ids(images, labels)
    prompt_length = len(free[0]) - MAX_NEW_TOKENS
    counts: dict[int, int] = {}
    for row in free:
        for token in set(row[prompt_length:]):
            counts[token] = counts.get(token, 0) + 1
    eos = max((n, token) for token, n in counts.items() if n < len(free))[1]  # ends some rows, not all
    processor, model = reference_blip
    sep = model.config.text_config.sep_token_id
    generator = stage.generator
    if runtime == "onnx":
        generator.generation = {**generator.generation, "eos_token_id": eos}
    else:
        generator.model.config.text_config.sep_token_id = eos
    model.config.text_config.sep_token_id = eos
    try:
        generated = stage.generate_ids(images, labels)
        expected = [reference_ids(reference_blip, decoded(n), label) for n, label in zip(names, labels)]
    finally:
        model.config.text_config.sep_token_id = sep
    assert generated == expected
    ended = [row for row in generated if len(row) < len(free[0])]
    assert ended and len(ended) < len(generated) and all(row[-1] == eos for row in ended)


def test_greedy_loop_pads_ended_rows_and_stops_when_all_ended():
    from blip_captioner.greedy import decoder_prompt, greedy_generate

    eos, pad, vocab = 9, 0, 10
    script = {0: [5, eos], 1: [6, 7, 7, eos]}  # each row's tokens; the loop must stop after row 1's eos
    fed: list[list[int]] = []

    def step(new, past):
        fed.append(new[:, -1].tolist())
        logits = np.zeros((len(new), vocab), dtype=np.float32)
        for row in range(len(new)):
            logits[row, script[row][min(len(fed) - 1, len(script[row]) - 1)]] = 1.0
        return logits, past + [len(fed)]

    prompt = decoder_prompt(np.array([[101, 3, 4, 102], [101, 3, 4, 102]]), bos=8)
    assert prompt.tolist() == [[8, 3, 4], [8, 3, 4]]
    out = greedy_generate(prompt, step, [], eos, pad, max_new_tokens=20)
    assert out == [[8, 3, 4, 5, eos], [8, 3, 4, 6, 7, 7, eos]]
    assert fed == [[4, 4], [5, 6], [eos, 7], [pad, 7]]  # an ended row is fed pad, as generate does
    fed.clear()
    assert greedy_generate(prompt, step, [], eos, pad, max_new_tokens=1) == [[8, 3, 4, 5], [8, 3, 4, 6]]


def test_tokenizer_json_equals_blips_bert_tokenizer(reference_blip):
    """The ONNX path's tokenizers file encodes every Food-11 prompt and decodes any ids (special ones,
    word pieces, punctuation that transformers' clean-up joins) as BlipProcessor's slow tokenizer does."""
    from blip_captioner.text import BlipText
    from build.food_captioning import FOOD11_LABELS

    slow, ours = reference_blip[0].tokenizer, BlipText(CAPTIONER_DIR)
    assert len(FOOD11_LABELS) == 11
    for text in [f"a photo of {label}".lower() for label in FOOD11_LABELS] + ["a photo of crème brûlée, isn't it?"]:
        assert ours.encode(text) == slow(text).input_ids, text
    rng = np.random.default_rng(0)
    specials = [0, 100, 101, 102, 103, 30522, 30523]
    punctuation = slow.convert_tokens_to_ids(["'", ".", ",", "?", "!", "s", "t", "m", "re", "ve", "##s", "n"])
    sequences = [rng.choice(rng.integers(0, len(slow), 30).tolist() + specials + punctuation * 3,
                            int(rng.integers(1, 30))).tolist() for _ in range(500)]
    assert ours.decode(sequences) == slow.batch_decode(sequences, skip_special_tokens=True)


def test_onnx_runtime_refuses_beam_search_at_load(captioner):
    config = json_format.MessageToDict(parse_config("food_captioning_captioner"), preserving_proto_field_name=True)
    config["parameters"]["num_beams"] = {"string_value": "3"}
    args = {"model_config": json.dumps(config), "model_name": "food_captioning_captioner", "model_version": "1",
            "model_repository": str(CAPTIONER_DIR.parent), "model_instance_kind": "CPU",
            "model_instance_device_id": "0"}
    with pytest.raises(ValueError, match="num_beams 3: runtime 'onnx' decodes greedily"):
        type(captioner)().initialize(args)


def test_captioner_fails_only_the_bad_requests(captioner):
    good = np.zeros((2, 3, 64, 64), dtype=np.float32)
    requests = [
        pb.InferenceRequest({"pixel_values": good, "label": np.array([[b"Rice"], [b"Soup"]], dtype=object)}),
        pb.InferenceRequest({"pixel_values": good[:1], "label": np.array([[b"\xff\xfe"]], dtype=object)}),
        pb.InferenceRequest({"pixel_values": np.zeros((1, 3, 32, 32), dtype=np.float32),
                             "label": np.array([[b"Rice"]], dtype=object)}),
        pb.InferenceRequest({"pixel_values": good, "label": np.array([[b"Rice"]], dtype=object)}),
    ]
    ok, bad_utf8, bad_size, mismatch = captioner.execute(requests)
    assert [c.decode().split()[3] for c in ok.output("caption")[:, 0]] == ["rice", "soup"]
    for response, message in ((bad_utf8, "UTF-8"), (bad_size, "this BLIP takes"), (mismatch, "2 images but 1")):
        assert response.error().code() == pb.TritonError.INVALID_ARG and message in response.error().message()


def test_classifier_fails_only_the_group_it_cannot_run(classifier):
    good = np.zeros((2, 3, 224, 224), dtype=np.float32)
    ok, bad = classifier.execute([pb.InferenceRequest({"pixel_values": good}),
                                  pb.InferenceRequest({"pixel_values": np.zeros((1, 3, 0, 0), dtype=np.float32)})])
    assert ok.output("label").shape == (2, 1) and ok.output("score").dtype == np.float32
    assert bad.has_error()


def test_preprocess_stage_does_not_import_torch():
    code = ("import sys, fake_pb_utils; sys.modules['triton_python_backend_utils'] = fake_pb_utils; "
            "import image_preprocess.model; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    root = MODEL_REPOSITORY.parent
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": f"{root / 'backends'}:{root / 'tests'}"})
    assert out.stdout.strip() == "[]"
