"""`make model`'s OpenVINO export of the generator (build/openvino_export.py) on a tiny GPT-J: CODEGEN_WEIGHTS is
checked before anything is built; the export is deterministic (two exports of the same weights, each into a cache
of its own, give the same bytes) and cached (a second call copies the cached IR, no export process); int4 weights
are compressed, and the OpenVINO engine serves them."""
from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from transformers import GPTJConfig, GPTJForCausalLM

from build import openvino_export
from gptj_generator.loading import load_engine
from gptj_generator.seam import GenerationRequest
from test_codegen_engine import GENERATOR_DIR, Collector

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random 2-layer GPT-J, 64 wide (one int4 group per row), with the demo tokenizer, saved as `make model`
    saves the generator."""
    folder = tmp_path_factory.mktemp("tiny_gptj")
    torch.manual_seed(0)
    config = GPTJConfig(vocab_size=4096, n_positions=128, n_embd=64, n_layer=2, n_head=4, rotary_dim=16,
                        bos_token_id=0, eos_token_id=0)
    GPTJForCausalLM(config).eval().save_pretrained(folder, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(GENERATOR_DIR / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def cache(tmp_path_factory, tiny):
    """An export cache of this module's own, holding the tiny model's fp32 IR."""
    folder = tmp_path_factory.mktemp("openvino_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(folder))  # the machine cache of build/model_cache.py, here
        openvino_export.export(tiny, tmp_path_factory.mktemp("fp32") / "openvino", "fp32")
    return folder


def digests(folder) -> dict[str, str]:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
            for name in ("openvino_model.xml", "openvino_model.bin")}


def test_an_unknown_weight_format_is_refused_before_anything_is_built(monkeypatch):
    monkeypatch.setenv(openvino_export.WEIGHTS_ENV, "int3")
    with pytest.raises(SystemExit, match="choose one of"):
        openvino_export.weight_format()
    monkeypatch.setenv(openvino_export.WEIGHTS_ENV, "int4")
    assert openvino_export.weight_format() == "int4"
    monkeypatch.delenv(openvino_export.WEIGHTS_ENV)
    assert openvino_export.weight_format() == "fp32"


def test_the_export_is_deterministic_and_cached(tiny, cache, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "another-cache"))
    fresh = digests(openvino_export.export(tiny, tmp_path / "fresh", "fp32"))

    def no_export(*args, **kwargs):
        raise AssertionError("exported again although the cache holds this IR")

    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setattr(openvino_export.subprocess, "run", no_export)
    cached = openvino_export.export(tiny, tmp_path / "cached", "fp32")
    assert digests(cached) == fresh, "two exports of the same weights differ"
    assert json.loads((cached / openvino_export.INFO_FILE).read_text()) == {
        "weights": "fp32", "source_sha256": openvino_export.source_digest(tiny)}
    assert not (cached / "openvino_config.json").exists(), "optimum's file records the source path"


def test_int4_weights_are_smaller_and_served(tiny, cache, tmp_path, monkeypatch):
    """int4 here (int8: test_codegen_fidelity.py, on the demo model)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    fp32 = openvino_export.export(tiny, tmp_path / "fp32", "fp32")  # from the cache
    int4 = openvino_export.export(tiny, tmp_path / "int4", "int4")
    assert json.loads((int4 / openvino_export.INFO_FILE).read_text())["weights"] == "int4"
    size, full = (int4 / "openvino_model.bin").stat().st_size, (fp32 / "openvino_model.bin").stat().st_size
    assert size < full * 0.3, (size, full)
    engine = load_engine("openvino", tiny, 4, 64, ir_dir=int4)
    try:
        assert engine.weights == "int4"
        sink = Collector()
        engine.submit(GenerationRequest([5, 6, 7, 8], 16), sink)
        assert sink.wait().error is None and 0 < len(sink.ids) <= 16
        assert all(0 <= i < 4096 for i in sink.ids)
    finally:
        engine.close()
