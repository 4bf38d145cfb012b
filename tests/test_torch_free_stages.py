"""Stages that run no network must not import torch: every stub that does carries torch's memory and import time.
A model declares that it runs torch with the `torch_threads` parameter; all others must stay torch-free.
The models the gateway generates at registration are checked too: their encoders (clip_encoder,
transformer_encoder) run on ONNX Runtime over the graphs exported then, without torch or transformers."""
from __future__ import annotations

import subprocess
import sys

import pytest

from gateway_helpers import CLIP_DEMO, ST_CLS_DEMO
from model_configs import ROOT, all_models, parse_config

TORCH_FREE = [m for m in all_models()
              if parse_config(m).platform != "ensemble" and "torch_threads" not in parse_config(m).parameters]


def test_some_stages_are_torch_free():
    assert "text_embedding_tokenizer" in TORCH_FREE and "text_embedding_pooling" in TORCH_FREE


def _assert_loads_torch_free(load: str) -> None:
    code = (
        "import sys\n"
        f"sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'backends')!r}, {str(ROOT / 'tests')!r}]\n"
        "import fake_pb_utils; sys.modules['triton_python_backend_utils'] = fake_pb_utils\n"
        "from pathlib import Path\n"
        "from model_configs import load_generated, load_python_model\n"
        f"{load}\n"
        "heavy = sorted(m for m in ('torch', 'flair', 'transformers') if m in sys.modules)\n"
        "assert not heavy, f'imports {heavy}'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("model", TORCH_FREE)
def test_stage_initializes_without_importing_torch(model):
    _assert_loads_torch_free(f"load_python_model({model!r})")


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The demo CLIP and the demo sentence-transformers model generated as the gateway registers them."""
    from gateway.modelgen import generate

    repo = tmp_path_factory.mktemp("generated")
    specs = [generate(name, None, kind, ROOT / name, repo) for name, kind in ((CLIP_DEMO, "clip"),
                                                                               (ST_CLS_DEMO, "sentence_transformer"))]
    assert [s.runtime for s in specs] == ["onnx", "onnx"]
    return repo, {m for s in specs for m in s.triton_models if m not in s.ensembles}


@pytest.mark.parametrize("suffix", ["clip_demo_*_encoder", "clip_demo_*_tokenizer", "clip_demo_*_image_preprocess",
                                    "st_cls_demo_*_encoder", "st_cls_demo_*_tokenizer", "st_cls_demo_*_pooling"])
def test_generated_stage_initializes_without_importing_torch(generated, suffix):
    repo, models = generated
    (folder,) = [p for p in repo.glob(f"emb_demo_models_{suffix}") if p.name in models]
    if folder.name.endswith("_encoder"):
        assert 'string_value: "onnx"' in (folder / "config.pbtxt").read_text()
    _assert_loads_torch_free(f"load_generated(Path({str(repo)!r}), {folder.name!r})")
