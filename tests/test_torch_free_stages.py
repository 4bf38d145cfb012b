"""Stages that run no network must not import torch: every stub that does costs ~230 MiB.
A model declares that it runs torch with the `torch_threads` parameter; all others must stay torch-free."""
from __future__ import annotations

import subprocess
import sys

import pytest

from model_configs import ROOT, all_models, parse_config

TORCH_FREE = [m for m in all_models()
              if parse_config(m).platform != "ensemble" and "torch_threads" not in parse_config(m).parameters]


def test_some_stages_are_torch_free():
    assert "text_embedding_tokenizer" in TORCH_FREE and "text_embedding_pooling" in TORCH_FREE


@pytest.mark.parametrize("model", TORCH_FREE)
def test_stage_initializes_without_importing_torch(model):
    code = (
        "import sys\n"
        f"sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'backends')!r}, {str(ROOT / 'tests')!r}]\n"
        "import fake_pb_utils; sys.modules['triton_python_backend_utils'] = fake_pb_utils\n"
        "from model_configs import load_python_model\n"
        f"load_python_model({model!r})\n"
        "heavy = sorted(m for m in ('torch', 'flair', 'transformers') if m in sys.modules)\n"
        "assert not heavy, f'imports {heavy}'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
