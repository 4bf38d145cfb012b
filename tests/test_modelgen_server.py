"""Generated models served by a live Triton (no gateway): the sentence-transformers ensembles equal
SentenceTransformer.encode, the CLIP text and image ensembles equal CLIPModel.get_text_features /
get_image_features with CLIPProcessor, for rows of different lengths and sizes in one request and across
concurrent requests. Their encoders run on ONNX Runtime (exported at generation, as at registration);
a model whose export fails is served on torch, equally. Model names start with './' so they never
collide with the gateway tests' models."""
from __future__ import annotations

import io
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

from gateway.modelgen import ExportOptions, generate, onnx_cache, resolve_source
from gateway.settings import default_model_roots
from gateway_helpers import CLIP_DEMO, ST_CLS_DEMO, minilm_path, normalized, png_bytes
from model_configs import ROOT

pytestmark = pytest.mark.integration
TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "  The girl is carrying a baby.  ",
         "Ünïcödé text, with punctuation!?", "a", "x " * 400]
CLIP_TEXTS = ["a photo of a cat", "a red square on a blue background", "stripes", "a", "pizza " * 120,
              "the quick brown fox jumps over the lazy dog"]
IMAGES = [png_bytes((80, 60), (200, 30, 30)), png_bytes((64, 64), (10, 200, 10), pattern=2),
          png_bytes((300, 120), (20, 20, 220), pattern=5), png_bytes((33, 500), (240, 240, 0), pattern=1)]


def _jpeg_gray(size=(120, 90)) -> bytes:
    """A grayscale JPEG: converted to RGB like CLIPProcessor does."""
    pixels = (np.arange(size[0] * size[1]) % 251).astype(np.uint8).reshape(size[1], size[0])
    buffer = io.BytesIO()
    Image.fromarray(pixels, "L").save(buffer, "JPEG", quality=95)
    return buffer.getvalue()


IMAGES.append(_jpeg_gray())


def local_name(path: str) -> str:
    """A name of its own for the same folder (the gateway tests use the plain path): relative to the
    repository when the folder is inside it (the venv usually is), else absolute."""
    relative = os.path.relpath(path, ROOT)
    return path if relative.startswith("..") else "./" + relative


def served(triton, data_dir, name: str, kind: str, export: ExportOptions | None = None, source=None):
    source = source or resolve_source(name, None, kind, default_model_roots())
    spec = generate(name, None, kind, source, data_dir / "triton_models", export)
    triton.load(*spec.ensembles)
    return spec


def encoder_runtime(data_dir, spec) -> str:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    (encoder,) = [m for m in spec.triton_models if m.endswith("_encoder")]
    config = model_config_pb2.ModelConfig()
    text_format.Parse((data_dir / "triton_models" / encoder / "config.pbtxt").read_text(), config)
    return config.parameters["runtime"].string_value


def infer(client, model: str, input_name: str, rows: list) -> np.ndarray:
    import tritonclient.grpc as grpcclient

    array = np.array([[r.encode() if isinstance(r, str) else r] for r in rows], dtype=np.object_)
    tensor = grpcclient.InferInput(input_name, list(array.shape), "BYTES")
    tensor.set_data_from_numpy(array)
    return client.infer(model, [tensor], outputs=[grpcclient.InferRequestedOutput("embedding")]).as_numpy("embedding")


def concurrently(triton, model: str, input_name: str, requests: list[list]) -> list[np.ndarray]:
    import tritonclient.grpc as grpcclient

    def one(rows):
        client = grpcclient.InferenceServerClient(triton.grpc_url)
        try:
            return infer(client, model, input_name, rows)
        finally:
            client.close()

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(one, requests))


@pytest.mark.parametrize("model", ["minilm", ST_CLS_DEMO])
def test_sentence_transformer_ensemble_equals_encode(triton, data_dir, model):
    from sentence_transformers import SentenceTransformer

    path = minilm_path() if model == "minilm" else str(ROOT / model)
    spec = served(triton, data_dir, local_name(path), "sentence_transformer")
    assert spec.runtime == encoder_runtime(data_dir, spec) == "onnx"
    reference = SentenceTransformer(path, device="cpu").encode(TEXTS, normalize_embeddings=True)
    got = infer(triton.client, spec.text_model, "text", TEXTS)
    assert got.shape == (len(TEXTS), spec.dimension) and got.dtype == np.float32
    np.testing.assert_allclose(normalized(got), reference, atol=1e-5)
    if spec.normalized:
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    # concurrent requests of different row counts and lengths are batched by Triton, rows stay theirs
    requests = [TEXTS[i:] + TEXTS[:i] for i in range(len(TEXTS))] + [TEXTS[i:i + 1] for i in range(len(TEXTS))]
    for rows, out in zip(requests, concurrently(triton, spec.text_model, "text", requests)):
        order = [TEXTS.index(t) for t in rows]
        np.testing.assert_allclose(normalized(out), reference[order], atol=1e-5)


@pytest.fixture(scope="module")
def clip(triton, data_dir):
    from transformers import CLIPModel, CLIPProcessor

    path = str(ROOT / CLIP_DEMO)
    spec = served(triton, data_dir, local_name(path), "clip")
    assert spec.runtime == encoder_runtime(data_dir, spec) == "onnx"
    return spec, CLIPModel.from_pretrained(path).eval(), CLIPProcessor.from_pretrained(path)


def clip_text_reference(model, processor, texts: list[str]) -> np.ndarray:
    import torch

    with torch.inference_mode():  # one text at a time: no padding in the reference
        return np.concatenate([model.get_text_features(**processor(text=[t], truncation=True, max_length=77,
                                                                   return_tensors="pt")).numpy() for t in texts])


def clip_image_reference(model, processor, images: list[bytes]) -> np.ndarray:
    import torch

    pil = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
    with torch.inference_mode():
        return model.get_image_features(**processor(images=pil, return_tensors="pt")).numpy()


def test_clip_text_ensemble_equals_get_text_features(triton, clip):
    spec, model, processor = clip
    reference = normalized(clip_text_reference(model, processor, CLIP_TEXTS))
    got = infer(triton.client, spec.text_model, "text", CLIP_TEXTS)
    assert got.shape == (len(CLIP_TEXTS), spec.dimension)
    np.testing.assert_allclose(normalized(got), reference, atol=1e-5)
    assert abs(np.linalg.norm(got[0]) - 1) > 1e-3, "raw projected features: the gateway normalizes"
    requests = [CLIP_TEXTS[i:] for i in range(len(CLIP_TEXTS))] + [CLIP_TEXTS[::-1]]
    for rows, out in zip(requests, concurrently(triton, spec.text_model, "text", requests)):
        np.testing.assert_allclose(normalized(out), reference[[CLIP_TEXTS.index(t) for t in rows]], atol=1e-5)


def test_clip_image_ensemble_equals_get_image_features(triton, clip):
    spec, model, processor = clip
    reference = normalized(clip_image_reference(model, processor, IMAGES))
    got = infer(triton.client, spec.image_model, "image", IMAGES)
    assert got.shape == (len(IMAGES), spec.dimension)
    np.testing.assert_allclose(normalized(got), reference, atol=1e-5)
    requests = [IMAGES[i:] for i in range(len(IMAGES))] + [IMAGES[::-1], IMAGES[1:2]]
    for rows, out in zip(requests, concurrently(triton, spec.image_model, "image", requests)):
        np.testing.assert_allclose(normalized(out), reference[[IMAGES.index(x) for x in rows]], atol=1e-5)


def test_clip_text_and_image_at_once_share_the_encoder(triton, clip):
    spec, model, processor = clip
    text_ref = normalized(clip_text_reference(model, processor, CLIP_TEXTS))
    image_ref = normalized(clip_image_reference(model, processor, IMAGES))
    jobs = [(spec.text_model, "text", CLIP_TEXTS), (spec.image_model, "image", IMAGES)] * 3
    import tritonclient.grpc as grpcclient

    (encoder,) = [m for m in spec.triton_models if m.endswith("_encoder")]
    rows_before = triton.stats(encoder).inference_count

    def one(job):
        client = grpcclient.InferenceServerClient(triton.grpc_url)
        try:
            return infer(client, *job)
        finally:
            client.close()

    with ThreadPoolExecutor(len(jobs)) as pool:
        for (_, kind, _rows), out in zip(jobs, pool.map(one, jobs)):
            np.testing.assert_allclose(normalized(out), text_ref if kind == "text" else image_ref, atol=1e-5)
    rows = triton.stats(encoder).inference_count - rows_before
    assert rows == 3 * (len(CLIP_TEXTS) + len(IMAGES)), "both ensembles' rows went through the one encoder model"


def test_undecodable_image_fails_its_own_request_only(triton, clip):
    from tritonclient.utils import InferenceServerException

    spec, model, processor = clip
    with pytest.raises(InferenceServerException) as caught:
        infer(triton.client, spec.image_model, "image", [b"not an image"])
    assert "Traceback" not in str(caught.value)
    got = infer(triton.client, spec.image_model, "image", IMAGES[:1])
    np.testing.assert_allclose(normalized(got), normalized(clip_image_reference(model, processor, IMAGES[:1])),
                               atol=1e-5)


# ---- the runtime each registration gets

def test_registering_the_same_clip_again_exports_nothing(triton, data_dir, clip):
    """Another name for the same weights (a second registration, or the next start): the graphs come from
    the cache beside the repository, and the new models serve the same features."""
    spec, model, processor = clip
    cache = data_dir / "onnx_cache"
    records = {p: p.stat().st_mtime_ns for p in cache.glob("*/export.json")}
    before = onnx_cache.exports_started
    again = served(triton, data_dir, "clip demo, registered again", "clip", source=ROOT / CLIP_DEMO)
    assert onnx_cache.exports_started == before and again.runtime == "onnx"
    assert {p: p.stat().st_mtime_ns for p in cache.glob("*/export.json")} == records, "nothing rewritten"
    np.testing.assert_allclose(normalized(infer(triton.client, again.text_model, "text", CLIP_TEXTS)),
                               normalized(clip_text_reference(model, processor, CLIP_TEXTS)), atol=1e-5)


def test_the_cache_is_not_in_the_repository_triton_reads(triton, data_dir, clip):
    """Triton takes every folder of a repository for a model: the generated repository holds model
    folders only (the graphs are linked in from DATA_DIR/onnx_cache)."""
    names = {m.name for m in triton.client.get_model_repository_index().models}
    folders = {p.name for p in (data_dir / "triton_models").iterdir()}
    assert folders <= names and not [f for f in folders if f.startswith(".")]
    assert all((data_dir / "triton_models" / f / "config.pbtxt").is_file() for f in folders)


@pytest.mark.parametrize("kind", ["clip", "sentence_transformer"])
def test_a_failed_export_is_served_on_torch_equally(triton, data_dir, tmp_path, kind):
    """An export that exceeds its tolerance (here any difference does) leaves the model on torch: the
    registration succeeds and the ensembles give the reference outputs."""
    failing = ExportOptions(cache_dir=tmp_path / "cache", tolerance=-1.0)
    folder = ROOT / (CLIP_DEMO if kind == "clip" else ST_CLS_DEMO)
    spec = served(triton, data_dir, f"{folder.name} on torch", kind, failing, source=folder)
    assert spec.runtime == encoder_runtime(data_dir, spec) == "torch"
    if kind == "clip":
        from transformers import CLIPModel, CLIPProcessor

        model, processor = CLIPModel.from_pretrained(str(folder)).eval(), CLIPProcessor.from_pretrained(str(folder))
        got = infer(triton.client, spec.text_model, "text", CLIP_TEXTS)
        np.testing.assert_allclose(normalized(got), normalized(clip_text_reference(model, processor, CLIP_TEXTS)),
                                   atol=1e-5)
        got = infer(triton.client, spec.image_model, "image", IMAGES)
        np.testing.assert_allclose(normalized(got), normalized(clip_image_reference(model, processor, IMAGES)),
                                   atol=1e-5)
    else:
        from sentence_transformers import SentenceTransformer

        reference = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, normalize_embeddings=True)
        np.testing.assert_allclose(normalized(infer(triton.client, spec.text_model, "text", TEXTS)), reference,
                                   atol=1e-5)
    for ensemble in spec.ensembles:  # its torch stub's memory back for the tests after this one
        triton.client.unload_model(ensemble, unload_dependents=True)
