"""Each network stage's compute on cuda:0 against the same stage on the CPU, on the demo models, driving the
stages' Triton-free classes as their model.py does: embeddings and CLIP features within 1e-3, NER emissions close
and spans equal, labels equal, captions' greedy tokens equal (or parted once at a near tie on the CPU's logits, in at
most one row in eight: gpu_helpers.check_rows), and a bad request in a batch fails alone on the GPU while its
batch-mates are answered. Each GPU stage is checked where it runs (gpu_helpers.assert_on_gpu: ONNX Runtime's
CUDA provider first, torch's tensors on cuda:0) and, for torch, that the GPU's allocator worked during its call.
The codegen generator is in test_gpu_codegen.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

from gpu_helpers import (CLIP_DIR, EMBEDDING_TOLERANCE, GPU_TIER, LOGIT_TOLERANCE, MODEL_REPOSITORY, Row,
                         assert_on_gpu, check_rows, gpu_memory_grows, max_difference, model_dir, normalized, on_gpu,
                         onnx_on_gpu_or_skip)

pytestmark = GPU_TIER

TEXTS = ["A man is eating food.", "", "Ünïcödé naïve café 東京 🙂", "word " * 300, "The GPU and the CPU agree."]
NER_TEXTS = ["George Washington went to Washington.", "Angela Merkel met Bill Gates in Munich on Monday.",
             "Zoë Saldaña visited Zürich. Then she flew to New York with Siemens AG.", "x", ""]
THREADS = 4


def _runtime_dir(model: str, runtime: str, torch_files: tuple[str, ...], onnx_files: tuple[str, ...]):
    if runtime == "onnx":
        folder = model_dir(model, *[f for f in torch_files if not f.endswith(".safetensors")])
        onnx_on_gpu_or_skip(folder, *onnx_files)
        return folder
    return model_dir(model, *torch_files)


def placed(name: str, runtime: str, stage, call):
    """call()'s result, after checking that `stage` is on the GPU (and, with torch, that the GPU computed)."""
    assert_on_gpu(f"{name} ({runtime})", stage)
    return gpu_memory_grows(f"{name} ({runtime})", call) if runtime == "torch" else call()


@pytest.mark.parametrize("runtime", ["torch", "onnx"])
def test_text_embeddings_on_cuda_equal_cpu(runtime):
    from mean_pooling.pooling import mean_pool_normalize
    from text_tokenizer.tokenization import TextTokenizer
    from transformer_encoder.encoder import make_encoder

    folder = _runtime_dir("text_embedding_encoder", runtime, ("config.json", "model.safetensors"), ("model.onnx",))
    tokenizer = TextTokenizer(model_dir("text_embedding_tokenizer", "tokenizer.json") / "tokenizer.json", 256)
    requests = tokenizer.encode_per_request([[t] for t in TEXTS] + [TEXTS])  # each alone, then all in one
    cpu = make_encoder(folder, runtime, THREADS)
    gpu = make_encoder(folder, runtime, THREADS, gpu=on_gpu("text_embedding_encoder"))
    on_device = placed("text_embedding_encoder", runtime, gpu, lambda: gpu.encode_per_request(requests))
    for (ids, mask), c, g in zip(requests, cpu.encode_per_request(requests), on_device):
        difference = max_difference(mean_pool_normalize(c, mask), mean_pool_normalize(g, mask))
        assert difference <= EMBEDDING_TOLERANCE, f"{runtime}: embeddings differ by {difference:.2e}"


def _clip_requests():
    from transformers import AutoTokenizer

    from clip_encoder.clip import ImageRows, TextRows
    from food_images import encode, photo
    from image_preprocess.preprocess import SingleImagePreprocessor

    tokens = AutoTokenizer.from_pretrained(str(CLIP_DIR))(["a photo of a pizza", "sushi on a plate", ""],
                                                            padding=True, return_tensors="np")
    pixels = SingleImagePreprocessor(CLIP_DIR / "preprocessor_config.json", 50)(
        [encode(photo(96 + 8 * seed, 80, seed), "PNG") for seed in range(3)])
    return [TextRows(tokens["input_ids"].astype(np.int64), tokens["attention_mask"].astype(np.int64)),
            ImageRows(pixels), ImageRows(pixels[1:2])]


def test_clip_features_on_cuda_equal_cpu():
    from clip_encoder.clip import make_towers

    if not (CLIP_DIR / "model.safetensors").is_file():
        pytest.skip(f"{CLIP_DIR} is not built: run `make model` (tools/gpu_check.sh installs the carry)")
    requests = _clip_requests()
    cpu, gpu = make_towers(CLIP_DIR, "torch", THREADS), make_towers(CLIP_DIR, "torch", THREADS, on_gpu("clip"))
    on_device = placed("clip", "torch", gpu, lambda: gpu.encode_per_request(requests))
    for c, g in zip(cpu.encode_per_request(requests), on_device):
        difference = max_difference(normalized(c), normalized(g))
        assert difference <= EMBEDDING_TOLERANCE, f"CLIP features differ by {difference:.2e}"


@pytest.mark.parametrize("runtime", ["torch", "onnx"])
def test_ner_spans_on_cuda_equal_cpu(runtime):
    from ner_decoder.decoding import NerDecoder
    from ner_preprocess.preprocessing import NerPreprocessor
    from ner_tagger.rows import sentence_rows
    from ner_tagger.runtimes import make_tagger

    folder = _runtime_dir("ner_tagger", runtime, ("tagger_config.json", "tagger.safetensors"),
                          ("char_lm_forward.onnx", "char_lm_backward.onnx", "tagger_head.onnx"))
    preprocessor = NerPreprocessor(model_dir("ner_preprocess", "char_lm.json") / "char_lm.json")
    decoder = NerDecoder(model_dir("ner_decoder", "crf.json") / "crf.json")
    requests = [[text] for text in NER_TEXTS] + [NER_TEXTS]
    encoded = [preprocessor.encode(texts) for texts in requests]
    rows = [sentence_rows(e["char_ids"], e["sentence_chars"], e["sentence_tokens"], e["token_positions"],
                          e["token_count"]) for e in encoded]
    cpu = make_tagger(folder, runtime, THREADS)
    gpu = make_tagger(folder, runtime, THREADS, on_gpu("ner_tagger"))
    on_device = placed("ner_tagger", runtime, gpu, lambda: gpu.emissions_per_request(rows))
    found = 0
    for texts, e, c, g in zip(requests, encoded, cpu.emissions_per_request(rows), on_device):
        bound = LOGIT_TOLERANCE * max(1.0, float(np.abs(c).max(initial=0.0)))
        assert max_difference(c, g) <= bound, f"{runtime}: emissions differ by {max_difference(c, g):.2e}"
        spans = [decoder.decode(texts, emissions, e["token_offsets"], e["sentence_tokens"], e["token_count"])
                 for emissions in (c, g)]
        assert spans[1] == spans[0], f"{runtime}: emissions differ by {max_difference(c, g):.2e}: {spans}"
        assert all(isinstance(json.loads(row), list) for row in spans[1])
        found += sum(len(json.loads(row)) for row in spans[1])
    # the trained demo tagger finds names in these texts; seeded stand-in weights (gpu_carry) may find none
    assert found or (folder / "STAND_IN.txt").is_file(), f"{runtime}: no span found: equal, but nothing compared"


def _food_pixels():
    from food_images import encode, photo
    from image_preprocess.preprocess import FoodImagePreprocessor

    folder = model_dir("food_captioning_preprocess", "classifier_preprocessor_config.json",
                       "blip_preprocessor_config.json")
    preprocess = FoodImagePreprocessor(folder / "classifier_preprocessor_config.json",
                                       folder / "blip_preprocessor_config.json", 50)
    # 8 images: check_rows allows a near tie in one caption in eight
    return preprocess([encode(photo(120 + 16 * seed, 96, seed), "JPEG", quality=90) for seed in range(8)])


@pytest.mark.parametrize("runtime", ["torch", "onnx"])
def test_food_labels_on_cuda_equal_cpu(runtime):
    from image_classifier.classifier import make_classifier

    folder = _runtime_dir("food_captioning_classifier", runtime, ("config.json", "model.safetensors"),
                          ("model.onnx",))
    pixels, _ = _food_pixels()
    requests = [pixels[:1], pixels[1:]]
    cpu = make_classifier(folder, runtime, THREADS)
    gpu = make_classifier(folder, runtime, THREADS, on_gpu("food_captioning_classifier"))
    on_device = placed("food_captioning_classifier", runtime, gpu, lambda: gpu.classify_per_request(requests))
    for (cpu_labels, cpu_scores), (gpu_labels, gpu_scores) in zip(cpu.classify_per_request(requests), on_device):
        assert gpu_labels == cpu_labels
        assert max_difference(cpu_scores, gpu_scores) <= EMBEDDING_TOLERANCE


def _blip_logits(generator, pixels: np.ndarray, prefix: list[int]) -> np.ndarray:
    """The next-token logits after `prefix` (prompt included) for one image, as the runtime's decoder gives them."""
    if hasattr(generator, "model"):  # TorchBlip
        import torch

        with torch.inference_mode():
            image = generator.model.vision_model(pixel_values=torch.from_numpy(pixels[None]).to(generator.device))[0]
            ids = torch.tensor([prefix], device=generator.device)
            out = generator.model.text_decoder(input_ids=ids, attention_mask=torch.ones_like(ids),
                                               encoder_hidden_states=image)
            return out.logits[0, -1].float().cpu().numpy()
    cross = generator.vision.run(generator.cross_names, {"pixel_values": np.ascontiguousarray(pixels[None])})
    past = dict(zip((i.name for i in generator.past_inputs), generator._empty_past(1)))
    logits = generator.decoder.run(None, {"input_ids": np.array([prefix], np.int64), **past,
                                          **dict(zip(generator.cross_names, cross))})[0]
    return logits[0]


@pytest.mark.parametrize("runtime", ["torch", "onnx"])
def test_food_captions_on_cuda_equal_cpu(runtime):
    from blip_captioner.captioner import make_captioner

    folder = _runtime_dir("food_captioning_captioner", runtime, ("config.json", "tokenizer.json",
                                                                  "model.safetensors"),
                          ("vision.onnx", "decoder.onnx", "blip_generation.json"))
    _, pixels = _food_pixels()
    labels = ["pizza", "sushi", "salad", "pizza", "soup", "rice", "bread", "dessert"]
    cpu = make_captioner(folder, runtime, THREADS, max_new_tokens=20)
    gpu = make_captioner(folder, runtime, THREADS, on_gpu("food_captioning_captioner"), max_new_tokens=20)
    images = list(pixels)
    on_device = placed("food_captioning_captioner", runtime, gpu, lambda: gpu.generate_ids(images, labels))

    def logits_at(row: int, ids: list[int]):
        return lambda position: tuple(_blip_logits(stage.generator, pixels[row], ids[:position])
                                      for stage in (cpu, gpu))

    # the decoder's prompt is the tokenized prompt less its trailing [SEP] ([CLS] becomes [DEC]): not generated
    check_rows([Row(f"{runtime} caption of image {row}", c, g, logits_at(row, c),
                    first_new=len(cpu.text.encode(cpu.prompt(labels[row]))) - 1)
                for row, (c, g) in enumerate(zip(cpu.generate_ids(images, labels), on_device))])


def _encoder_args(kind: str) -> dict:
    """initialize() args for the text encoder's model.py as Triton gives them, runtime torch."""
    config = {"name": "text_embedding_encoder", "max_batch_size": 64,
              "parameters": {"runtime": {"string_value": "torch"}, "threads": {"string_value": str(THREADS)}}}
    return {"model_config": json.dumps(config), "model_name": "text_embedding_encoder", "model_version": "1",
            "model_repository": str(MODEL_REPOSITORY / "text_embedding_encoder"), "model_instance_kind": kind,
            "model_instance_name": "text_embedding_encoder_0_0", "model_instance_device_id": "0"}


def test_a_bad_request_fails_alone_on_the_gpu_and_the_gpu_goes_on():
    """An id outside the vocabulary or a row over the position embeddings would be a device-side assert on
    CUDA (every later call on that GPU fails): model.py refuses them per request before the forward. A request
    that breaks the shared forward itself (a CLIP image of the wrong size) is retried alone and fails alone."""
    import importlib.util

    import fake_pb_utils as pb
    from clip_encoder.clip import make_towers
    from stage_common.isolation import each_alone_on_failure

    model_dir("text_embedding_encoder", "config.json", "model.safetensors")
    spec = importlib.util.spec_from_file_location(
        "gpu_encoder_model", MODEL_REPOSITORY.parent / "backends" / "transformer_encoder" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    models = {}
    for kind in ("CPU", "GPU"):
        models[kind] = module.TritonPythonModel()
        models[kind].initialize(_encoder_args(kind))
    import torch

    assert torch.cuda.memory_allocated(0) > 0, "the GPU instance's weights are on the GPU"
    assert_on_gpu("text_embedding_encoder model.py, KIND_GPU", models["GPU"])

    def request(ids):
        ids = np.array([ids], np.int64)
        return pb.InferenceRequest({"input_ids": ids, "attention_mask": np.ones_like(ids)})

    good, other = [101, 7592, 2088, 102], [101, 2023, 2003, 1037, 3231, 102]
    batch = [request(good), request([101, 10 ** 6, 102]), request([101] + [1000] * 600 + [102]), request(other)]
    for attempt in range(2):  # the second batch shows the GPU is still usable after the refusals
        answered = {kind: model.execute(batch) for kind, model in models.items()}
        gpu, cpu = answered["GPU"], answered["CPU"]
        assert [r.has_error() for r in gpu] == [False, True, True, False], attempt
        assert all(r.error().code() == pb.TritonError.INVALID_ARG for r in gpu[1:3])
        for i in (0, 3):
            assert max_difference(cpu[i].output("token_embeddings"), gpu[i].output("token_embeddings")) <= 1e-3

    if not (CLIP_DIR / "model.safetensors").is_file():
        return
    towers = make_towers(CLIP_DIR, "torch", THREADS, on_gpu("clip"))
    requests = _clip_requests()
    wrong = type(requests[1])(np.zeros((1, 3, 17, 17), np.float32))  # not the vision tower's size
    results = each_alone_on_failure(towers.encode_per_request, [requests[0], wrong, requests[1]])
    assert isinstance(results[1], Exception) and not isinstance(results[0], Exception)
    expected = make_towers(CLIP_DIR, "torch", THREADS).encode_per_request([requests[0], requests[1]])
    for got, want in zip((results[0], results[2]), expected):
        assert max_difference(normalized(want), normalized(got)) <= EMBEDDING_TOLERANCE
