"""What to fetch of a hub repository, decided from its metadata before any byte of a file is fetched: the
files a loader needs (configs, tokenizer, safetensors weights; pickled weights only with
HUB_ALLOW_PICKLE=1), their total against HUB_MAX_DOWNLOAD_BYTES, and that it is the kind of model asked for."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from gateway import errors
from gateway.hub.explain import explain, gated
from gateway.hub.options import HubOptions

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
# Configs and tokenizer files a loader reads (top level, or one module folder down: 1_Pooling/config.json)
CONFIG_SUFFIXES = (".json", ".txt", ".model")
# Folders of other runtimes' exports, never needed (the gateway exports its own ONNX graphs)
SKIP_FOLDERS = {"onnx", "openvino", "tf", "flax", "coreml", "gguf"}


@dataclass(frozen=True)
class Plan:
    repo_id: str  # as the hub spells it
    commit: str
    files: dict[str, int]  # path in the repository -> size in bytes

    @property
    def total(self) -> int:
        return sum(self.files.values())


def size_text(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def select_files(repo_id: str, kind: str, sizes: dict[str, int | None], model_config: dict | None,
                 options: HubOptions) -> dict[str, int]:
    """The files a loader of `kind` needs out of the repository's listing (path -> size), checked for the
    kind of model, pickled weights and the size cap. Raises the error that says why not."""
    def usable(path: str) -> bool:
        parts = PurePosixPath(path).parts
        return len(parts) <= 2 and not (len(parts) == 2 and parts[0].lower() in SKIP_FOLDERS)

    names = {PurePosixPath(p).name for p in sizes if usable(p)}
    if kind == "sentence_transformer" and "modules.json" not in sizes:
        raise errors.NotEmbeddingModel(f"model '{repo_id}' is not a sentence-transformers model (the repository "
                                       "has no modules.json)")
    if kind == "clip":
        model_type = (model_config or {}).get("model_type")
        if "config.json" not in sizes or "preprocessor_config.json" not in sizes or model_type not in (None, "clip"):
            raise errors.NotEmbeddingModel(
                f"model '{repo_id}' is not a transformers CLIP model (needs config.json with model_type 'clip' and "
                f"preprocessor_config.json; the hub says model_type {model_type!r})")
    if "tokenizer.json" not in names:
        raise errors.NotEmbeddingModel(f"model '{repo_id}' has no tokenizer.json (a fast tokenizer), which the "
                                       "gateway's tokenizer stage needs")
    configs = {p: s for p, s in sizes.items() if usable(p) and p.endswith(CONFIG_SUFFIXES)}
    safetensors = {p: s for p, s in sizes.items() if usable(p) and p.endswith(".safetensors")}
    pickled = {p: s for p, s in sizes.items()
               if usable(p) and PurePosixPath(p).name.startswith("pytorch_model") and p.endswith(PICKLE_SUFFIXES)}
    if safetensors:
        weights = safetensors  # pickled weights beside them are never fetched
    elif pickled and options.allow_pickle:
        weights = pickled
    elif pickled:
        raise errors.HubPickleRefused(
            f"model '{repo_id}' has its weights only as pickled files ({', '.join(sorted(pickled))}); loading them "
            "can run code from the repository: set HUB_ALLOW_PICKLE=1 to allow it, or use a repository with "
            "safetensors weights")
    else:
        raise errors.NotEmbeddingModel(f"model '{repo_id}' has no weights the gateway can load "
                                       "(*.safetensors, or pytorch_model*.bin with HUB_ALLOW_PICKLE=1)")
    files = {**configs, **weights}
    unknown = sorted(p for p, s in files.items() if s is None)
    if unknown:
        raise errors.HubUnreachable(f"the hub did not give the sizes of {', '.join(unknown[:3])} of '{repo_id}'; "
                                    "the size cap cannot be checked, so nothing is downloaded")
    total = sum(files.values())
    if total > options.max_bytes:
        raise errors.HubTooLarge(
            f"model '{repo_id}' needs {size_text(total)} in {len(files)} files, over the download cap of "
            f"{size_text(options.max_bytes)} (HUB_MAX_DOWNLOAD_BYTES={options.max_bytes})")
    return files


def plan_download(repo_id: str, kind: str, options: HubOptions) -> Plan:
    """Ask the hub for the repository's files and sizes (no file content) and decide what to fetch."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=options.endpoint, token=options.token or False)
    try:
        info = api.model_info(repo_id, files_metadata=True, timeout=options.metadata_timeout_s)
    except Exception as exc:  # noqa: BLE001 - every failure becomes the error that says why
        raise explain(exc, repo_id, options) from None
    if info.gated and not options.token:
        raise gated(info.id or repo_id, options)
    if not info.sha:
        raise errors.HubUnreachable(f"the hub gave no commit for '{repo_id}'")
    sizes = {s.rfilename: s.size for s in info.siblings or []}
    files = select_files(info.id or repo_id, kind, sizes, info.config, options)
    return Plan(info.id or repo_id, info.sha, files)
