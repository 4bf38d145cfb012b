"""Where a model's files come from: a folder under the allowed model roots (no '..', no symlink out of
them) or a Hugging Face hub download; open_clip names mapped to their Hugging Face repositories."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Sequence

from gateway import hub
from gateway.errors import BadRequest, Forbidden, NotFound
from gateway.modelgen.weights import refuse_pickled

HUB_ID = hub.HUB_ID
MAX_NAME = 300

# open_clip (model, pretrained) -> transformers CLIPModel repository (open_clip itself needs torchvision)
OPEN_CLIP_MODELS: dict[tuple[str, str], str] = {
    ("ViT-B-32", "openai"): "openai/clip-vit-base-patch32",
    ("ViT-B-16", "openai"): "openai/clip-vit-base-patch16",
    ("ViT-L-14", "openai"): "openai/clip-vit-large-patch14",
    ("ViT-L-14-336", "openai"): "openai/clip-vit-large-patch14-336",
    ("ViT-B-32", "laion2b_s34b_b79k"): "laion/CLIP-ViT-B-32-laion2B-s34B-b79K",
    ("ViT-B-16", "laion2b_s34b_b88k"): "laion/CLIP-ViT-B-16-laion2B-s34B-b88K",
    ("ViT-L-14", "laion2b_s32b_b82k"): "laion/CLIP-ViT-L-14-laion2B-s32B-b82K",
    ("ViT-H-14", "laion2b_s32b_b79k"): "laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
    ("ViT-g-14", "laion2b_s12b_b42k"): "laion/CLIP-ViT-g-14-laion2B-s12B-b42K",
    ("ViT-bigG-14", "laion2b_s39b_b160k"): "laion/CLIP-ViT-bigG-14-laion2B-39B-b160k",
}
OPEN_CLIP_ARCHITECTURES = {name for name, _ in OPEN_CLIP_MODELS}


def triton_name(model_name: str, pretrained: str | None) -> str:
    """A Triton model name made only of [a-z0-9_]: a readable slug plus a hash of the exact key."""
    key = f"{model_name}\0{pretrained or ''}"
    slug = re.sub(r"[^a-z0-9]+", "_", f"{model_name} {pretrained or ''}".lower()).strip("_")[:40].strip("_")
    return f"emb_{slug or 'model'}_{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def _check_name(model_name: str) -> None:
    if not isinstance(model_name, str) or not model_name.strip():
        raise BadRequest("model_name is empty", param="model_name")
    if len(model_name) > MAX_NAME or "\0" in model_name or "\\" in model_name:
        raise BadRequest(f"model_name is not a usable name (at most {MAX_NAME} characters, no NUL or backslash)",
                         param="model_name")


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long for the file system (ENAMETOOLONG) names no folder: not a 500
        return False


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def local_folder(model_name: str, roots: Sequence[Path]) -> Path | None:
    """The folder `model_name` names under a model root, or None if it names none (then it may be a hub id).
    Raises BadRequest for '..' (the document's pattern says so: gateway/schemas/seed.py); Forbidden (403) for
    absolute paths outside the roots and symlinks out of them: which paths those are is the settings' and
    the disk's, no schema can say it."""
    roots = [Path(r).resolve() for r in roots]
    path = Path(model_name)
    if ".." in path.parts:
        raise BadRequest(f"model_name {model_name!r} contains '..': name a folder under MODEL_ROOTS", param="model_name")
    candidates = [path] if path.is_absolute() else [root / path for root in roots]
    for candidate in candidates:
        if not _exists(candidate):
            continue
        resolved = candidate.resolve()
        if not _inside(resolved, roots):
            raise Forbidden(f"model_name {model_name!r} is outside the allowed model roots (MODEL_ROOTS)",
                            param="model_name")
        if not resolved.is_dir():
            raise BadRequest(f"model_name {model_name!r} is a file, not a model folder", param="model_name")
        for item in resolved.rglob("*"):  # a file linking out of the roots could read anything
            if item.is_symlink() and not _inside(item.resolve(), roots):
                raise Forbidden(f"model_name {model_name!r} holds a symlink out of MODEL_ROOTS ({item.name})",
                                param="model_name")
        return resolved
    if path.is_absolute():
        raise Forbidden(f"model_name {model_name!r} is outside the allowed model roots (MODEL_ROOTS)",
                        param="model_name")
    return None


def hub_folder(repo_id: str, kind: str, hub_options: hub.HubOptions) -> Path:
    """The hub repository's files for a loader of `kind`: cached, or downloaded if HUB_DOWNLOADS allows it
    (bounded and explained: gateway/hub/); never one that would serve pickled weights unless
    HUB_ALLOW_PICKLE=1."""
    folder = hub.hub_folder(repo_id, kind, hub_options)
    if not hub_options.allow_pickle:
        refuse_pickled(folder, repo_id)
    return folder


def resolve_source(model_name: str, pretrained: str | None, kind: str, model_roots: Sequence[Path],
                   hub_options: hub.HubOptions | None = None) -> Path:
    """The folder to generate the model from: a folder under `model_roots`, else a hub repository (an
    open_clip pair mapped to its repository first). `hub_options` None: no downloads (HUB_DOWNLOADS=off).
    Either way, a folder that would serve pickled weights is refused unless HUB_ALLOW_PICKLE=1."""
    _check_name(model_name)
    hub_options = hub_options or hub.HubOptions()
    if kind == "clip" and model_name in OPEN_CLIP_ARCHITECTURES:
        repo = OPEN_CLIP_MODELS.get((model_name, pretrained or ""))
        if repo is None:
            known = ", ".join(f"{m}+{p}" for m, p in OPEN_CLIP_MODELS if m == model_name)
            raise BadRequest(f"unknown open_clip pair {model_name!r} + {pretrained!r}; known for {model_name}: {known}",
                             param="pretrained")
        return hub_folder(repo, kind, hub_options)
    folder = local_folder(model_name, model_roots)
    if folder is not None:
        if not hub_options.allow_pickle:  # a local path is no way around the gate (issue 56)
            refuse_pickled(folder, model_name, "a folder under MODEL_ROOTS")
        return folder
    if HUB_ID.match(model_name):
        return hub_folder(model_name, kind, hub_options)
    raise NotFound(f"model '{model_name}' is neither a folder under MODEL_ROOTS nor a hub id (org/name)",
                   param="model_name", code="model_not_found")
