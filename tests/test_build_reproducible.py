"""`make model` is reproducible: a fresh build of every pipeline into another folder is
byte-identical to the artifacts in model_repository/ (built by `make model` before the tests)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from build.build_models import PIPELINES
from build.common import tree_digest
from model_configs import MODEL_REPOSITORY, ROOT


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_rebuild_is_byte_identical(pipeline, tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "build" / "build_models.py"), "--profile", "demo",
                           "--repository", str(tmp_path), pipeline], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    if pipeline == "embedding_demo":  # models loaded at run time, built beside the repository
        demo = tmp_path.with_name(tmp_path.name + "_demo_models")
        built = sorted(p.name for p in demo.iterdir())
        assert built == ["clip-demo", "st-cls-demo"], built
        for model in built:
            assert tree_digest(demo / model) == tree_digest(ROOT / "demo_models" / model), model
        return
    built = sorted(p.parent.name for p in tmp_path.glob("*/1"))
    assert built, "the builder wrote nothing"
    for model in built:
        assert tree_digest(tmp_path / model / "1") == tree_digest(MODEL_REPOSITORY / model / "1"), model
