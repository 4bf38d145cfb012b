"""Write the Triton model folders of a sentence-transformers or CLIP model into the gateway's generated
repository: the pipelines' generic stages (text_tokenizer, transformer_encoder, mean_pooling,
image_preprocess, clip_encoder) configured from the model's own files, and one ensemble per modality.

The encoder (a sentence-transformers model's transformer, or both CLIP towers) is exported to ONNX first,
in a subprocess, once per set of weights (onnx_cache.py), and runs on ONNX Runtime; when the export is
off, fails or differs from torch, that model runs on torch (`ModelSpec.runtime`, and a comment in its
encoder's config.pbtxt, say which and why).

Each folder is written under a temporary name and renamed into place, so Triton never sees half a model."""
from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from gateway.errors import BadRequest
from gateway.modelgen import templates
from gateway.modelgen.onnx_cache import ExportOptions, export_graphs
from gateway.modelgen.sources import triton_name
from gateway.modelgen.spec import ImageLimits, ModelSpec
from gateway.modelgen.weights import PICKLE_SUFFIXES, WEIGHT_SUFFIXES, module_folder, served_weights

POOLING_KEYS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
                "pooling_mode_max_tokens": "max", "pooling_mode_lasttoken": "lasttoken",
                "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                "pooling_mode_weightedmean_tokens": "weightedmean"}
ST_MAX_BATCH, CLIP_MAX_BATCH = 64, 32


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError:
        raise BadRequest(f"{path.name} of the model is not valid JSON", param="model_name") from None


def _write_model(repository: Path, name: str, config: str, files: dict[str, Path]) -> None:
    """repository/name/{config.pbtxt, 1/<files>}: weights linked (not copied), the rest copied."""
    tmp = repository / f".tmp_{name}_{uuid.uuid4().hex[:8]}"
    (tmp / "1").mkdir(parents=True)
    (tmp / "config.pbtxt").write_text(config)
    for target, source in files.items():
        dest = tmp / "1" / target
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.suffix in WEIGHT_SUFFIXES:
            os.symlink(source.resolve(), dest)
        else:
            shutil.copyfile(source, dest)
    final = repository / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def _tokenizer_files(folder: Path) -> dict[str, Path]:
    if not (folder / "tokenizer.json").is_file():
        raise BadRequest(f"the model has no tokenizer.json (a fast tokenizer) in {folder.name}/", param="model_name")
    return {p.name: p for p in folder.iterdir() if p.is_file() and p.suffix not in PICKLE_SUFFIXES and (
        p.name.startswith("tokenizer") or p.name in ("special_tokens_map.json", "vocab.txt", "vocab.json", "merges.txt"))}


def _model_files(folder: Path) -> dict[str, Path]:
    weights = served_weights(folder)
    if not weights:
        raise BadRequest(f"the model folder {folder.name}/ has no weights (*.safetensors or *.bin)", param="model_name")
    config = {"config.json": folder / "config.json"} if (folder / "config.json").is_file() else {}
    return {**config, **{p.name: p for p in weights}}


def _max_seq_length(transformer_dir: Path, source: Path, config: dict) -> int:
    """As SentenceTransformer.max_seq_length: sentence_bert_config.json, else the tokenizer's
    model_max_length (sentence-transformers 5.x), capped by the model's position embeddings."""
    positions = int(config.get("max_position_embeddings", 512))
    st_config = _json(transformer_dir / "sentence_bert_config.json") or _json(source / "sentence_bert_config.json")
    length = st_config.get("max_seq_length")
    if not length:
        tokenizer_max = _json(transformer_dir / "tokenizer_config.json").get("model_max_length")
        length = tokenizer_max if isinstance(tokenizer_max, int) and tokenizer_max < 1_000_000 else positions
    return min(int(length), positions)


def _sentence_transformer(model_name: str, source: Path, repository: Path, export: ExportOptions,
                          generation: int = 0) -> ModelSpec:
    modules = _json(source / "modules.json")
    if not modules:
        raise BadRequest(f"'{model_name}' is not a sentence-transformers model (no modules.json)", param="model_name")
    kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
    unsupported = [k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")]
    if unsupported or kinds[:2] != ["Transformer", "Pooling"]:
        raise BadRequest(f"'{model_name}': modules {kinds} are not supported (Transformer -> Pooling -> optional "
                         f"Normalize; not {unsupported or kinds})", param="model_name")
    folders = [module_folder(source, m.get("path", "1_Pooling" if i == 1 else ""), model_name)  # before any file is read
               for i, m in enumerate(modules)]
    transformer_dir = folders[0]
    pooling = _json(folders[1] / "config.json")
    if "pooling_mode" in pooling:  # sentence-transformers >= 5.x writes the mode as one string
        named = str(pooling["pooling_mode"]).lower()
        modes = [named] if named in POOLING_KEYS.values() else []
        bad = [] if modes else [pooling["pooling_mode"]]
    else:
        bad, modes = [], [mode for key, mode in POOLING_KEYS.items() if pooling.get(key)]
    if bad or len(modes) != 1:  # several modes are concatenated by sentence-transformers: not reproduced
        raise BadRequest(f"'{model_name}': pooling {bad or modes} is not supported (exactly one of "
                         f"{', '.join(POOLING_KEYS.values())})", param="model_name")
    normalize = "Normalize" in kinds
    config = _json(transformer_dir / "config.json")
    dimension = int(pooling.get("word_embedding_dimension") or pooling.get("embedding_dimension")
                    or config.get("hidden_size", 0))
    max_tokens = _max_seq_length(transformer_dir, source, config)
    base = generation_name(triton_name(model_name, None), generation)
    names = {"tokenizer": f"{base}_tokenizer", "encoder": f"{base}_encoder", "pooling": f"{base}_pooling"}
    tokenizer_files = _tokenizer_files(transformer_dir)
    model_files = _model_files(transformer_dir)
    graphs = export_graphs("encoder", transformer_dir, list(model_files.values()), repository, export)
    _write_model(repository, names["tokenizer"], templates.tokenizer(names["tokenizer"], max_tokens, ST_MAX_BATCH),
                 tokenizer_files)
    _write_model(repository, names["encoder"],
                 templates.transformer_encoder(names["encoder"], dimension, ST_MAX_BATCH, graphs.runtime, graphs.note),
                 {**model_files, **graphs.files})
    _write_model(repository, names["pooling"],
                 templates.pooling(names["pooling"], dimension, modes[0], normalize, ST_MAX_BATCH), {})
    _write_model(repository, base, templates.text_ensemble(base, names, dimension, ST_MAX_BATCH), {})
    return ModelSpec(model_name=model_name, pretrained=None, kind="sentence_transformer", dimension=dimension,
                     max_tokens=max_tokens, text_model=base, image_model=None,
                     triton_models=(base, *names.values()), normalized=normalize,
                     tokenizer_file=str(repository / names["tokenizer"] / "1" / "tokenizer.json"),
                     max_batch_size=ST_MAX_BATCH, runtime=graphs.runtime)


def _clip(model_name: str, pretrained: str | None, source: Path, repository: Path, export: ExportOptions,
          limits: ImageLimits, generation: int = 0) -> ModelSpec:
    config = _json(source / "config.json")
    if config.get("model_type") != "clip":
        raise BadRequest(f"'{model_name}' is not a transformers CLIPModel (config.json model_type "
                         f"{config.get('model_type')!r})", param="model_name")
    if not (source / "preprocessor_config.json").is_file():
        raise BadRequest(f"'{model_name}' has no preprocessor_config.json (CLIP's image processor)", param="model_name")
    dimension = int(config.get("projection_dim", 512))
    max_tokens = int(config.get("text_config", {}).get("max_position_embeddings", 77))
    base = generation_name(triton_name(model_name, pretrained), generation)
    names = {"tokenizer": f"{base}_tokenizer", "preprocess": f"{base}_image_preprocess", "encoder": f"{base}_encoder"}
    tokenizer_files, model_files = _tokenizer_files(source), _model_files(source)
    graphs = export_graphs("clip", source, list(model_files.values()), repository, export)
    _write_model(repository, names["tokenizer"], templates.tokenizer(names["tokenizer"], max_tokens, CLIP_MAX_BATCH),
                 tokenizer_files)
    preprocess = templates.image_preprocess(names["preprocess"], CLIP_MAX_BATCH, limits.max_image_bytes,
                                            limits.max_megapixels)
    _write_model(repository, names["preprocess"], preprocess,
                 {"preprocessor_config.json": source / "preprocessor_config.json"})
    _write_model(repository, names["encoder"],
                 templates.clip_encoder(names["encoder"], dimension, CLIP_MAX_BATCH, graphs.runtime, graphs.note),
                 {**model_files, **graphs.files})
    text, image = f"{base}_text", f"{base}_image"
    _write_model(repository, text, templates.clip_text_ensemble(text, names, dimension, CLIP_MAX_BATCH), {})
    _write_model(repository, image, templates.clip_image_ensemble(image, names, dimension, CLIP_MAX_BATCH), {})
    return ModelSpec(model_name=model_name, pretrained=pretrained, kind="clip", dimension=dimension,
                     max_tokens=max_tokens, text_model=text, image_model=image,
                     triton_models=(text, image, *names.values()), normalized=False,
                     tokenizer_file=str(repository / names["tokenizer"] / "1" / "tokenizer.json"),
                     max_batch_size=CLIP_MAX_BATCH, runtime=graphs.runtime)


def generation_name(base: str, generation: int) -> str:
    """Generation 0 is the plain name; a replacement loaded beside it (registry `replace`) gets `_g<n>`."""
    return f"{base}_g{generation}" if generation else base


def generate(model_name: str, pretrained: str | None, kind: str, source: Path, repository: Path,
             export: ExportOptions | None = None, limits: ImageLimits | None = None,
             generation: int = 0) -> ModelSpec:
    """Write every folder the model needs (replacing earlier ones of the same name) and describe it.
    `export`: the ONNX export's settings (default: on, cache beside `repository`); `limits`: the
    gateway's image limits, written into the image stage's config (default: Settings' defaults).
    `generation` > 0: other Triton names, so that a new version loads beside the one serving."""
    repository.mkdir(parents=True, exist_ok=True)
    export = export or ExportOptions()
    if kind == "sentence_transformer":
        return _sentence_transformer(model_name, source, repository, export, generation)
    if kind == "clip":
        return _clip(model_name, pretrained, source, repository, export, limits or ImageLimits.of(), generation)
    raise ValueError(f"unknown model kind {kind!r}")


def remove(spec: ModelSpec, repository: Path) -> None:
    """Delete the model's generated folders (never a shipped model's)."""
    for name in spec.triton_models:
        folder = repository / name
        if folder.parent == repository and folder.is_dir():
            shutil.rmtree(folder)


def remove_generated(model_name: str, pretrained: str | None, repository: Path) -> int:
    """Delete every folder generated for (model_name, pretrained), loaded or not; how many were removed."""
    base = triton_name(model_name, pretrained)
    folders = [p for p in repository.glob(f"{base}*") if p.is_dir() and (p.name == base or p.name.startswith(base + "_"))]
    for folder in folders:
        shutil.rmtree(folder)
    return len(folders)
