"""Which files of a model folder a generated model serves, and which a hub source may hold: weights are
the folder's safetensors, or its `.bin` files when it has none (pickled: loading them can run code); a
module path from `modules.json` must name a folder inside the model's own folder."""
from __future__ import annotations

from pathlib import Path, PurePosixPath

from gateway import errors
from gateway.errors import BadRequest
from gateway.hub.plan import PICKLE_SUFFIXES, SKIP_FOLDERS

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".onnx")  # linked into a generated model, never copied


def served_weights(folder: Path) -> list[Path]:
    """The weight files a model generated from `folder` links: its safetensors; its pickled `.bin` files
    only when it has no safetensors (transformers would load the safetensors anyway)."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".safetensors", ".bin"))
    safe = [p for p in files if p.suffix == ".safetensors"]
    return safe or files


def refuse_pickled(folder: Path, name: str, where: str = "the hub cache") -> None:
    """HUB_ALLOW_PICKLE=0: no model folder, a hub repository's or a local one, may have pickled files as the
    weights it would serve. The download plan never fetches them then, but the cache may hold a download made
    while the setting was 1 (or by another program sharing HUB_CACHE_DIR), and the same snapshot can be named
    as a folder under MODEL_ROOTS (the repository holds data/hub_cache: issue 56). Other runtimes' export
    folders (openvino/openvino_model.bin is no pickle) are never served, so not read."""
    folders = (folder, *sorted(d for d in folder.rglob("*") if d.is_dir() and not _exported(d, folder)))
    pickled = [p for d in folders for p in served_weights(d) if p.suffix in PICKLE_SUFFIXES]
    if pickled:
        names = ", ".join(p.relative_to(folder).as_posix() for p in pickled)
        raise errors.HubPickleRefused(
            f"model '{name}' would serve pickled weights ({names}) from {where}; loading them can run code from "
            "the files: set HUB_ALLOW_PICKLE=1 to allow it, or use a model with safetensors weights")


def _exported(directory: Path, folder: Path) -> bool:
    return any(part.lower() in SKIP_FOLDERS for part in directory.relative_to(folder).parts)


def module_folder(source: Path, path: object, model_name: str) -> Path:
    """The folder a `modules.json` entry names: a relative path without '..' that resolves (symlinks
    followed) inside `source`; anything else is a 400 naming the path."""
    def refuse(why: str) -> BadRequest:
        return BadRequest(f"'{model_name}': modules.json names the module path {path!r}, which {why}; a module "
                          "path must be a folder inside the model's own folder", param="model_name")

    if not isinstance(path, str) or "\0" in path or "\\" in path:
        raise refuse("is not a relative folder name")
    relative = PurePosixPath(path)
    if relative.is_absolute():
        raise refuse("is absolute")
    if ".." in relative.parts:
        raise refuse("contains '..'")
    folder = (source / relative).resolve()
    root = source.resolve()
    if folder != root and root not in folder.parents:
        raise refuse("leads out of the model's folder")
    return folder
