"""Hub downloads of runtime loads (gateway/hub/) against tests/fake_hub.py, never the real hub: the
session's HF_ENDPOINT is local for every process; the HUB_DOWNLOADS default rule; a download by id gives
the files of the local folder in its layout (safetensors, never pickles beside them), once however many
threads ask; every refusal (downloads off, allowlist, size cap, pickled weights, unreachable hub, missing
model, gated without a token, wrong kind of model, timeout) has its own error, and none fetches a byte."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from fake_hub import FakeHub, folder_files
from gateway import errors, hub
from gateway.hub import download
from gateway.modelgen import resolve_source
from gateway.settings import Settings
from gateway_helpers import CLIP_DEMO, ST_CLS_DEMO
from model_configs import ROOT

ST_ID, CLIP_ID = "fake-org/st-cls-demo", "fake-org/clip-demo"


@pytest.fixture()
def fake_hub():
    with FakeHub() as fake:
        fake.add(ST_ID, ROOT / ST_CLS_DEMO)
        fake.add(CLIP_ID, ROOT / CLIP_DEMO)
        yield fake


def options(fake: FakeHub, tmp_path: Path, **kw) -> hub.HubOptions:
    return hub.HubOptions(**{"downloads": "on", "endpoint": fake.url, "cache_dir": tmp_path / "hub_cache", **kw})


# ---------------------------------------------------------------- no test reaches the real hub

def test_every_process_of_the_session_gets_a_local_hub_endpoint():
    from huggingface_hub import constants

    from launcher.gateway_process import GatewayProcess
    from launcher.triton_server import server_env

    endpoint = os.environ["HF_ENDPOINT"]
    assert endpoint.startswith("http://127.0.0.1:"), endpoint
    assert constants.ENDPOINT == endpoint, "huggingface_hub read HF_ENDPOINT before conftest set it"
    gateway = GatewayProcess("127.0.0.1:1", port=1)
    assert gateway.env["HF_ENDPOINT"] == endpoint, "launcher/gateway_process.py passes HF_ENDPOINT on"
    assert "HF_HUB_OFFLINE" not in gateway.env, "the gateway is no longer forced offline: HUB_DOWNLOADS decides"
    assert server_env()["HF_ENDPOINT"] == endpoint
    assert Settings.from_env().hf_endpoint == endpoint


def test_the_closed_endpoint_refuses_and_says_so(tmp_path):
    closed = hub.HubOptions(downloads="on", endpoint=os.environ["HF_ENDPOINT"], cache_dir=tmp_path)
    with pytest.raises(errors.HubUnreachable, match="cannot be reached") as caught:
        hub.hub_folder(ST_ID, "sentence_transformer", closed)
    assert caught.value.status == 502 and caught.value.code == "hub_unreachable"


# ---------------------------------------------------------------- the setting

@pytest.mark.parametrize("host,keys,expected", [
    ("127.0.0.1", False, "on"), ("localhost", False, "on"), ("::1", False, "on"), ("127.0.0.2", False, "on"),
    ("0.0.0.0", False, "off"), ("10.1.2.3", False, "off"), ("::", False, "off"), ("example.org", False, "off"),
    ("0.0.0.0", True, "on"), ("10.1.2.3", True, "on")])
def test_default_rule(host, keys, expected):
    assert hub.default_downloads(host, keys_configured=keys) == expected


def test_settings_from_env(tmp_path):
    assert Settings.from_env({"HOST": "0.0.0.0"}).hub_downloads == "off"
    assert Settings.from_env({"HOST": "127.0.0.1"}).hub_downloads == "on"
    assert Settings.from_env({"HOST": "0.0.0.0", "GATEWAY_API_KEYS_FILE": str(tmp_path / "keys")}).hub_downloads == "on"
    s = Settings.from_env({"HOST": "127.0.0.1", "HUB_DOWNLOADS": "off"})
    assert s.hub_downloads == "off"
    s = Settings.from_env({"HOST": "0.0.0.0", "HUB_DOWNLOADS": " Sentence-Transformers, intfloat/e5-small-v2 ,laion",
                           "HUB_MAX_DOWNLOAD_BYTES": "1000", "HUB_ALLOW_PICKLE": "1", "HF_TOKEN": "hf_x",
                           "DATA_DIR": str(tmp_path)})
    assert (s.hub_downloads, s.hub_allowlist) == ("allowlist",
                                                  ("sentence-transformers", "intfloat/e5-small-v2", "laion"))
    o = s.hub_options()
    assert (o.max_bytes, o.allow_pickle, o.token, o.cache_dir) == (1000, True, "hf_x", tmp_path / "hub_cache")
    assert "hf_x" not in repr(s) and "hf_x" not in repr(o), "the token never shows in a repr"
    for bad in ("sentence transformers", "a/b/c", "../x", ","):
        with pytest.raises(ValueError, match="HUB_DOWNLOADS"):
            Settings.from_env({"HUB_DOWNLOADS": bad})


# ---------------------------------------------------------------- downloads

def test_download_by_id_gives_the_local_folder_layout(fake_hub, tmp_path):
    fake_hub.add("fake-org/with-pickle", ROOT / ST_CLS_DEMO, files={"pytorch_model.bin": b"\x80pickle",
                                                                    "onnx/model.onnx": b"x" * 1000})
    opts = options(fake_hub, tmp_path)
    folder = resolve_source(ST_ID, None, "sentence_transformer", [tmp_path / "no-models"], opts)
    local = folder_files(ROOT / ST_CLS_DEMO)
    got = folder_files(folder)
    assert got == {name: data for name, data in local.items() if name != "README.md"}, "same files, same layout"
    assert fake_hub.downloads(ST_ID, "model.safetensors") == 1
    other = hub.hub_folder("fake-org/with-pickle", "sentence_transformer", opts)
    assert "pytorch_model.bin" not in folder_files(other) and fake_hub.downloads("fake-org/with-pickle",
                                                                                 "pytorch_model.bin") == 0
    assert fake_hub.downloads("fake-org/with-pickle", "onnx/model.onnx") == 0
    clip = hub.hub_folder(CLIP_ID, "clip", opts)
    assert folder_files(clip) == folder_files(ROOT / CLIP_DEMO)
    # a second load: the completed download, no request to the hub at all (works with the hub gone too)
    before = sum(fake_hub.requests.values())
    assert hub.hub_folder(ST_ID, "sentence_transformer", opts) == folder
    assert sum(fake_hub.requests.values()) == before


def test_concurrent_loads_of_one_id_download_once(fake_hub, tmp_path):
    fake_hub.throttle_s = 0.002  # the download lasts long enough for every thread to ask while it runs
    opts = options(fake_hub, tmp_path)
    results, failures = [], []

    def load():
        try:
            results.append(hub.hub_folder(ST_ID, "sentence_transformer", opts))
        except Exception as exc:  # noqa: BLE001
            failures.append(exc)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures and len(set(results)) == 1 and len(results) == 4
    assert fake_hub.downloads(ST_ID, "model.safetensors") == 1
    assert fake_hub.requests[("GET", "info", ST_ID, "")] == 1, "one metadata request: the others waited"


def test_pickled_weights_only_with_hub_allow_pickle(fake_hub, tmp_path):
    fake_hub.add("fake-org/pickled", ROOT / ST_CLS_DEMO, rename={"model.safetensors": "pytorch_model.bin"})
    with pytest.raises(errors.HubPickleRefused, match="HUB_ALLOW_PICKLE=1") as caught:
        hub.hub_folder("fake-org/pickled", "sentence_transformer", options(fake_hub, tmp_path))
    assert (caught.value.status, caught.value.code) == (422, "hub_pickle_refused")
    assert fake_hub.content_requests() == 0
    folder = hub.hub_folder("fake-org/pickled", "sentence_transformer", options(fake_hub, tmp_path, allow_pickle=True))
    assert (folder / "pytorch_model.bin").is_file()


# ---------------------------------------------------------------- refusals: each its own error, no byte fetched

def test_downloads_off_names_hub_downloads(fake_hub, tmp_path):
    with pytest.raises(errors.HubDownloadsOff, match="HUB_DOWNLOADS") as caught:
        resolve_source(ST_ID, None, "sentence_transformer", [tmp_path], options(fake_hub, tmp_path, downloads="off"))
    assert (caught.value.status, caught.value.code, caught.value.param) == (403, "hub_downloads_off", "model_name")
    with pytest.raises(errors.HubDownloadsOff, match="HUB_DOWNLOADS"):  # no options at all: off
        resolve_source(ST_ID, None, "sentence_transformer", [tmp_path])
    assert not fake_hub.requests, "nothing asked of the hub"


def test_allowlist(fake_hub, tmp_path):
    fake_hub.add("other-org/st", ROOT / ST_CLS_DEMO)
    opts = options(fake_hub, tmp_path, downloads="allowlist", allowlist=("fake-org", "third/one-model"))
    with pytest.raises(errors.HubNotAllowed, match=r"not on the hub download allowlist \(HUB_DOWNLOADS=fake-org,") as c:
        hub.hub_folder("other-org/st", "sentence_transformer", opts)
    assert (c.value.status, c.value.code) == (403, "hub_model_not_allowed")
    assert not fake_hub.requests
    assert hub.hub_folder(ST_ID.upper(), "sentence_transformer", opts).is_dir(), "an org on the list, any case"
    by_id = options(fake_hub, tmp_path, downloads="allowlist", allowlist=("other-org/st",))
    assert hub.hub_folder("other-org/st", "sentence_transformer", by_id).is_dir()


def test_open_clip_names_are_mapped_before_the_allowlist_and_the_download(fake_hub, tmp_path):
    fake_hub.add("laion/CLIP-ViT-B-32-laion2B-s34B-b79K", ROOT / CLIP_DEMO)
    opts = options(fake_hub, tmp_path, downloads="allowlist", allowlist=("laion",))
    folder = resolve_source("ViT-B-32", "laion2b_s34b_b79k", "clip", [tmp_path], opts)
    assert folder_files(folder) == folder_files(ROOT / CLIP_DEMO)
    with pytest.raises(errors.HubNotAllowed, match="openai/clip-vit-base-patch32"):
        resolve_source("ViT-B-32", "openai", "clip", [tmp_path], opts)


def test_size_cap(fake_hub, tmp_path):
    with pytest.raises(errors.HubTooLarge, match=r"13\.5 MB in 10 files, over the download cap of 1\.0 MB "
                                                 r"\(HUB_MAX_DOWNLOAD_BYTES=1000000\)") as caught:
        hub.hub_folder(ST_ID, "sentence_transformer", options(fake_hub, tmp_path, max_bytes=1_000_000))
    assert (caught.value.status, caught.value.code) == (413, "hub_model_too_large")
    assert fake_hub.content_requests() == 0


def test_a_hub_sending_more_than_it_announced_is_stopped(fake_hub, tmp_path):
    repo = fake_hub.add("fake-org/liar", ROOT / ST_CLS_DEMO)
    repo.extra_sizes["model.safetensors"] = 1000  # announced 1 kB, serves 12.5 MB
    fake_hub.throttle_s = 0.01
    with pytest.raises(errors.HubTooLarge, match="the hub sent more than"):  # the parent watches the bytes arriving
        hub.hub_folder("fake-org/liar", "sentence_transformer", options(fake_hub, tmp_path))
    assert hub.completed("fake-org/liar", options(fake_hub, tmp_path)) is None


def test_unreachable_missing_gated_and_wrong_kind(fake_hub, tmp_path):
    fake_hub.add("fake-org/gated", ROOT / ST_CLS_DEMO, gated=True)
    fake_hub.add("fake-org/private", ROOT / ST_CLS_DEMO, private=True)
    cases = [("fake-org/no-such-model", "sentence_transformer", errors.HubModelNotFound, 404, "does not exist"),
             ("fake-org/private", "sentence_transformer", errors.HubModelNotFound, 404, "set HF_TOKEN"),
             ("fake-org/gated", "sentence_transformer", errors.HubGated, 403, "gated on the hub.*HF_TOKEN"),
             (CLIP_ID, "sentence_transformer", errors.NotEmbeddingModel, 422, "not a sentence-transformers model"),
             (ST_ID, "clip", errors.NotEmbeddingModel, 422, "not a transformers CLIP model")]
    for repo_id, kind, error, status, message in cases:
        with pytest.raises(error, match=message) as caught:
            hub.hub_folder(repo_id, kind, options(fake_hub, tmp_path))
        assert caught.value.status == status and "Traceback" not in caught.value.message
    assert fake_hub.content_requests() == 0
    with_token = options(fake_hub, tmp_path, token=fake_hub.token)
    assert hub.hub_folder("fake-org/gated", "sentence_transformer", with_token).is_dir()
    assert hub.hub_folder("fake-org/private", "sentence_transformer", with_token).is_dir()
    wrong = options(fake_hub, tmp_path, token="hf_wrong")
    fake_hub.add("fake-org/gated2", ROOT / ST_CLS_DEMO, gated=True)
    with pytest.raises(errors.HubGated, match="HF_TOKEN has no access"):
        hub.hub_folder("fake-org/gated2", "sentence_transformer", wrong)
    dead = FakeHub().start()
    url = dead.url
    dead.stop()
    with pytest.raises(errors.HubUnreachable, match=r"cannot be reached.*HF_ENDPOINT") as caught:
        hub.hub_folder(ST_ID, "sentence_transformer", hub.HubOptions(downloads="on", endpoint=url, cache_dir=tmp_path))
    assert caught.value.status == 502


def test_a_download_over_its_timeout_is_stopped_and_resumed_later(fake_hub, tmp_path):
    fake_hub.throttle_s = 0.05  # 12.5 MB in 64 KiB chunks: ~10 s
    with pytest.raises(errors.HubDownloadTimeout, match="HUB_DOWNLOAD_TIMEOUT_S") as caught:
        hub.hub_folder(ST_ID, "sentence_transformer", options(fake_hub, tmp_path, timeout_s=3))
    assert (caught.value.status, caught.value.code) == (504, "hub_download_timeout")
    assert hub.completed(ST_ID, options(fake_hub, tmp_path)) is None
    fake_hub.throttle_s = 0
    folder = hub.hub_folder(ST_ID, "sentence_transformer", options(fake_hub, tmp_path))
    assert (folder / "model.safetensors").read_bytes() == (ROOT / ST_CLS_DEMO / "model.safetensors").read_bytes()


def test_hf_hub_offline_in_the_gateways_environment_is_named(tmp_path):
    """huggingface_hub reads HF_HUB_OFFLINE at import: a process of its own, as a gateway started with it."""
    import subprocess
    import sys

    code = ("import pathlib; from gateway import hub, errors\n"
            "try:\n"
            f"    hub.hub_folder('{ST_ID}', 'sentence_transformer', hub.HubOptions(downloads='on', "
            f"cache_dir=pathlib.Path({str(tmp_path)!r})))\n"
            "except errors.HubDownloadsOff as e:\n"
            "    print(e.status, e.message)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("403 ") and "HF_HUB_OFFLINE=1" in out.stdout, out.stdout + out.stderr


def test_stopping_the_gateway_kills_a_download_in_progress(fake_hub, tmp_path):
    import time

    fake_hub.throttle_s = 0.05  # ~10 s of download
    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(_attempt(options(fake_hub, tmp_path))))
    thread.start()
    deadline = time.monotonic() + 60
    while not download._running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert download._running, "the download child did not start"
    hub.stop_downloads()  # what ModelRegistry.close does
    thread.join(30)
    assert not thread.is_alive(), "the load thread ended with its child"
    assert isinstance(outcome[0], errors.ApiError) and not download._running
    assert hub.completed(ST_ID, options(fake_hub, tmp_path)) is None


def _attempt(opts):
    try:
        return hub.hub_folder(ST_ID, "sentence_transformer", opts)
    except errors.ApiError as exc:
        return exc
