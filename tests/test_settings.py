"""gateway/settings.py: the variables the gateway has always read, under the same names, with the same
defaults and the same accepted values; a bad value refused naming its variable (and quoting no secret);
no .env; and docs/settings.md's table generated from the class."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway import settings_doc
from gateway.settings import ROOT, Settings, default_model_roots

# Settings.from_env({}) before pydantic-settings (the dataclass's from_env), field by field
DEFAULTS_BEFORE = {
    "triton_grpc_url": "127.0.0.1:8001", "host": "127.0.0.1", "port": 8080, "data_dir": ROOT / "data",
    "max_loaded_models": 5, "preload_models": (), "max_inputs": 2048, "max_text_bytes": 65536,
    "max_request_text_bytes": 16777216, "truncate_default": False, "max_image_bytes": 20971520,
    "max_image_megapixels": 50.0, "image_url_allowlist": (), "image_url_timeout_s": 10.0, "model_wait_s": 120.0,
    "request_timeout_s": 300.0, "coalesce_calls": 4, "drain_s": 25.0, "supervisor_state_file": None,
    "qdrant_url": None, "search_max_points": 256, "search_max_limit": 100, "faiss_ann_threshold": 20000,
    "collections_dir": None, "completions_model": "codegen", "completions_max_tokens": 512, "completions_max_n": 8,
    "completions_max_sequences": 64, "onnx_export": True, "onnx_export_timeout_s": 900.0,
    "onnx_export_tolerance": 0.0001, "onnx_cache_dir": None, "hub_downloads": "on", "hub_allowlist": (),
    "hub_max_download_bytes": 5000000000, "hub_allow_pickle": False, "hub_download_timeout_s": 1800.0,
    "hub_cache_dir": None, "hf_endpoint": None, "hf_token": None, "api_keys_file": None,
    "quota_requests_per_second": 500, "quota_concurrency": 64, "quota_tokens_per_minute": 200000,
    "quota_storage": "memory://", "quota_store_timeout_s": 2.0, "quota_store_retry_s": 5.0, "redis_url": None,
    "redis_prefix": "triton-pipelines:", "cluster_sync_s": 5.0, "cluster_heartbeat_s": 2.0,
    "cluster_heartbeat_ttl_s": 10.0, "max_body_bytes": 134217728, "body_buffer_bytes": 46137344,
    "body_buffer_key_bytes": None, "body_timeout_s": 60.0, "header_timeout_s": 10.0, "max_header_bytes": 16384,
    "keep_alive_s": 75.0, "max_connections": 1024, "max_connections_per_client": None, "allowed_hosts": (),
    "trusted_proxies": ()}

# every variable the gateway read before, one value each: (variable, value, attribute, what it becomes)
HOME = Path("~").expanduser().resolve()
READ = [
    ("GRPC_PORT", "9001", "triton_grpc_url", "127.0.0.1:9001"),
    ("TRITON_GRPC_URL", "triton:8001", "triton_grpc_url", "triton:8001"),
    ("CODEGEN_GRPC_URL", "triton-codegen:8011", "codegen_grpc_url", "triton-codegen:8011"),
    ("HOST", "0.0.0.0", "host", "0.0.0.0"),
    ("GATEWAY_PORT", "9000", "port", 9000),
    ("DATA_DIR", "~/d", "data_dir", HOME / "d"),
    ("MODEL_ROOTS", "/srv/a:/srv/b:", "model_roots", (Path("/srv/a"), Path("/srv/b"))),
    ("MAX_LOADED_MODELS", "2", "max_loaded_models", 2),
    ("PRELOAD_MODELS", " st:Org/A , clip:B|laion,,", "preload_models", ("st:Org/A", "clip:B|laion")),
    ("MAX_INPUTS", "10", "max_inputs", 10),
    ("MAX_TEXT_BYTES", "100", "max_text_bytes", 100),
    ("MAX_REQUEST_TEXT_BYTES", "1000", "max_request_text_bytes", 1000),
    ("TRUNCATE_DEFAULT", "true", "truncate_default", True),
    ("MAX_IMAGE_BYTES", "1000", "max_image_bytes", 1000),
    ("MAX_IMAGE_MEGAPIXELS", "2.5", "max_image_megapixels", 2.5),
    ("IMAGE_URL_ALLOWLIST", "Images.Example, cdn.example,", "image_url_allowlist", ("images.example", "cdn.example")),
    ("IMAGE_URL_TIMEOUT_S", "1.5", "image_url_timeout_s", 1.5),
    ("MODEL_WAIT_S", "3", "model_wait_s", 3.0),
    ("REQUEST_TIMEOUT_S", "4", "request_timeout_s", 4.0),
    ("COALESCE_CALLS", "0", "coalesce_calls", 0),
    ("COALESCE_QUEUE_ROWS", "512", "coalesce_queue_rows", 512),
    ("COALESCE_QUEUE_KEY_ROWS", "128", "coalesce_queue_key_rows", 128),
    ("QUEUE_TIMEOUT_S", "30", "queue_timeout_s", 30.0),
    ("DRAIN_S", "0.5", "drain_s", 0.5),
    ("SUPERVISOR_STATE_FILE", "run/state.json", "supervisor_state_file", Path("run/state.json")),
    ("CODEGEN_SUPERVISOR_STATE_FILE", "run/codegen.json", "codegen_supervisor_state_file", Path("run/codegen.json")),
    ("BUILD_STATE_DIR", "run/build", "build_state_dir", Path("run/build")),
    ("QDRANT_URL", "http://qdrant:6333", "qdrant_url", "http://qdrant:6333"),
    ("SEARCH_MAX_POINTS", "16", "search_max_points", 16),
    ("SEARCH_MAX_LIMIT", "7", "search_max_limit", 7),
    ("FAISS_ANN_THRESHOLD", "5", "faiss_ann_threshold", 5),
    ("FAISS_HNSW_THRESHOLD", "6", "faiss_ann_threshold", 6),
    ("COLLECTIONS_DIR", "/srv/c", "collections_dir", Path("/srv/c")),
    ("COMPLETIONS_MODEL", "coder", "completions_model", "coder"),
    ("COMPLETIONS_MAX_TOKENS", "64", "completions_max_tokens", 64),
    ("COMPLETIONS_MAX_N", "2", "completions_max_n", 2),
    ("COMPLETIONS_MAX_SEQUENCES", "4", "completions_max_sequences", 4),
    ("COMPLETIONS_SLOTS", "16", "completions_slots", 16),
    ("COMPLETIONS_QUEUE", "100", "completions_queue", 100),
    ("COMPLETIONS_QUEUE_KEY_SHARE", "10", "completions_queue_key_share", 10),
    ("ONNX_EXPORT", "0", "onnx_export", False),
    ("ONNX_EXPORT_TIMEOUT_S", "30", "onnx_export_timeout_s", 30.0),
    ("ONNX_EXPORT_TOLERANCE", "1e-3", "onnx_export_tolerance", 1e-3),
    ("ONNX_CACHE_DIR", "/srv/o", "onnx_cache_dir", Path("/srv/o")),
    ("HUB_DOWNLOADS", "off", "hub_downloads", "off"),
    ("HUB_MAX_DOWNLOAD_BYTES", "1000", "hub_max_download_bytes", 1000),
    ("HUB_ALLOW_PICKLE", "yes", "hub_allow_pickle", True),
    ("HUB_DOWNLOAD_TIMEOUT_S", "60", "hub_download_timeout_s", 60.0),
    ("HUB_CACHE_DIR", "/srv/h", "hub_cache_dir", Path("/srv/h")),
    ("HF_ENDPOINT", "http://hub.example", "hf_endpoint", "http://hub.example"),
    ("HF_TOKEN", "hf_x", "hf_token", "hf_x"),
    ("GATEWAY_API_KEYS_FILE", "/srv/keys", "api_keys_file", Path("/srv/keys")),
    ("QUOTA_REQUESTS_PER_SECOND", "0", "quota_requests_per_second", 0),
    ("QUOTA_CONCURRENCY", "3", "quota_concurrency", 3),
    ("QUOTA_TOKENS_PER_MINUTE", "100", "quota_tokens_per_minute", 100),
    ("QUOTA_STORAGE", "redis://r:6379", "quota_storage", "redis://r:6379"),
    ("QUOTA_STORE_TIMEOUT_S", "0.2", "quota_store_timeout_s", 0.2),
    ("QUOTA_STORE_RETRY_S", "1", "quota_store_retry_s", 1.0),
    ("REDIS_URL", "redis://r:6379/0", "quota_storage", "redis://r:6379/0"),  # quotas shared with it
    ("REDIS_URL", "redis://r:6379/0", "redis_url", "redis://r:6379/0"),
    ("REDIS_PREFIX", "test:", "redis_prefix", "test:"),
    ("REPLICA_ID", "replica-1", "replica_id", "replica-1"),
    ("CLUSTER_SYNC_S", "0.5", "cluster_sync_s", 0.5),
    ("CLUSTER_HEARTBEAT_S", "0.2", "cluster_heartbeat_s", 0.2),
    ("CLUSTER_HEARTBEAT_TTL_S", "3", "cluster_heartbeat_ttl_s", 3.0),
    ("MAX_BODY_BYTES", "2048", "max_body_bytes", 2048),
    ("BODY_BUFFER_BYTES", "4096", "body_buffer_bytes", 4096),
    ("BODY_BUFFER_KEY_BYTES", "1024", "body_buffer_key_bytes", 1024),
    ("BODY_TIMEOUT_S", "5", "body_timeout_s", 5.0),
    ("HEADER_TIMEOUT_S", "2", "header_timeout_s", 2.0),
    ("MAX_HEADER_BYTES", "8192", "max_header_bytes", 8192),
    ("KEEP_ALIVE_S", "1", "keep_alive_s", 1.0),
    ("MAX_CONNECTIONS", "64", "max_connections", 64),
    ("MAX_CONNECTIONS_PER_CLIENT", "0", "max_connections_per_client", 0),
    ("ALLOWED_HOSTS", "Gateway.Example", "allowed_hosts", ("gateway.example",)),
    ("TRUSTED_PROXIES", "10.0.0.0/8, ::1", "trusted_proxies", ("10.0.0.0/8", "::1")),
    ("TRACE_TRUSTED_SOURCES", "10.0.0.0/8, ::1", "trace_trusted_sources", ("10.0.0.0/8", "::1")),
]


def test_the_defaults_are_those_from_before():
    settings = Settings.from_env({})
    assert {name: getattr(settings, name) for name in DEFAULTS_BEFORE} == DEFAULTS_BEFORE
    assert settings.model_roots == default_model_roots() and settings.replica_id == socket.gethostname()


@pytest.mark.parametrize("variable,value,attribute,expected", READ, ids=[f"{r[0]}->{r[2]}" for r in READ])
def test_each_variable_is_read_under_its_name(variable, value, attribute, expected):
    assert getattr(Settings.from_env({variable: value}), attribute) == expected


def test_every_variable_read_before_is_a_field_and_the_table_lists_each():
    documented = {name for field in Settings.model_fields.values() for name in settings_doc.variables_of(field)}
    assert documented == {variable for variable, *_ in READ}
    assert all(field.description for field in Settings.model_fields.values())


@pytest.mark.parametrize("env,variable", [
    ({"MAX_INPUTS": "ten"}, "MAX_INPUTS"),
    ({"GATEWAY_PORT": "70000"}, "GATEWAY_PORT"),
    ({"GRPC_PORT": "x"}, "GRPC_PORT"),
    ({"DRAIN_S": "-1"}, "DRAIN_S"),
    ({"MAX_CONNECTIONS_PER_CLIENT": "-1"}, "MAX_CONNECTIONS_PER_CLIENT"),
    ({"BODY_BUFFER_BYTES": "0"}, "BODY_BUFFER_BYTES"),
    ({"ONNX_EXPORT": "maybe"}, "ONNX_EXPORT"),
    ({"HUB_DOWNLOADS": "a/b/c"}, "HUB_DOWNLOADS"),
    ({"HUB_ALLOW_PICKLE": "t"}, "HUB_ALLOW_PICKLE"),  # pydantic's bool takes t/y: the gateway never did
])
def test_a_bad_value_is_refused_alone_naming_its_variable(env, variable):
    with pytest.raises(ValidationError) as refused:
        Settings.from_env(env)
    assert refused.value.error_count() == 1, "no knock-on error about a setting derived from it"
    assert variable in str(refused.value)


def test_an_error_never_quotes_a_secret():
    secrets = {"HF_TOKEN": "hf_secret", "REDIS_URL": "redis://:pw1@r", "QUOTA_STORAGE": "redis://:pw2@r"}
    for bad in ({"MAX_INPUTS": "ten"}, {"HUB_DOWNLOADS": "a/b/c"}, {"ONNX_EXPORT": "maybe"}):
        with pytest.raises(ValidationError) as refused:
            Settings.from_env({**secrets, **bad})
        assert not any(s in str(refused.value) for s in ("hf_secret", "pw1", "pw2"))
    assert not any(s in repr(Settings.from_env(secrets)) for s in ("hf_secret", "pw1", "pw2"))


@pytest.mark.parametrize("word,value", [(w, True) for w in ("1", "true", "YES", " on ")] +
                         [(w, False) for w in ("0", "False", "no", "OFF")])
def test_flags_take_the_words_they_always_took(word, value):
    assert Settings.from_env({"TRUNCATE_DEFAULT": word}).truncate_default is value


def test_an_empty_or_blank_variable_is_unset():
    blank = {variable: "" for variable, *_ in READ} | {"MAX_INPUTS": "  ", "HOST": " "}
    settings = Settings.from_env(blank)
    assert {name: getattr(settings, name) for name in DEFAULTS_BEFORE} == DEFAULTS_BEFORE


def test_the_hub_default_follows_the_address_and_the_keys(tmp_path):
    assert Settings.from_env({"HOST": "0.0.0.0"}).hub_downloads == "off"
    assert Settings.from_env({"HOST": "0.0.0.0", "GATEWAY_API_KEYS_FILE": str(tmp_path / "k")}).hub_downloads == "on"
    assert Settings(host="0.0.0.0").hub_downloads == "off", "keyword arguments follow the same rule"
    s = Settings.from_env({"HUB_DOWNLOADS": "Org, org/Name"})
    assert (s.hub_downloads, s.hub_allowlist) == ("allowlist", ("org", "org/name"))


def test_a_fields_python_name_is_not_a_variable():
    """PORT is set by many platforms; only GATEWAY_PORT moves the gateway."""
    settings = Settings.from_env({"PORT": "1", "port": "2", "host": "0.0.0.0", "max_inputs": "3"})
    assert (settings.port, settings.host, settings.max_inputs) == (8080, "127.0.0.1", 2048)


def test_settings_reads_the_process_environment_and_keywords_win(monkeypatch):
    monkeypatch.setenv("MAX_INPUTS", "7")
    assert Settings().max_inputs == 7 and Settings.from_env().max_inputs == 7
    assert Settings(max_inputs=3).max_inputs == 3
    assert Settings.from_env({}).max_inputs == 2048, "from_env(env) reads env alone"


def test_no_dotenv_file_is_read(tmp_path, monkeypatch):
    monkeypatch.delenv("MAX_INPUTS", raising=False)
    (tmp_path / ".env").write_text("MAX_INPUTS=9\nHOST=0.0.0.0\n")
    monkeypatch.chdir(tmp_path)
    assert (Settings().max_inputs, Settings().host) == (2048, "127.0.0.1")


def test_settings_are_frozen_and_a_misspelt_keyword_fails():
    with pytest.raises(ValidationError):
        Settings().max_inputs = 1
    with pytest.raises(ValidationError, match="max_inptus"):
        Settings(max_inptus=1)


def test_the_docs_table_is_generated_from_the_class():
    assert settings_doc.committed() == settings_doc.table(), \
        "docs/settings.md is out of date: python -m gateway.settings_doc --write"
