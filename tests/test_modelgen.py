"""Model generation without a server: Triton-safe names, path safety of local model folders, the
open_clip table, reading sentence-transformers configs (pooling mode, Normalize, max_seq_length,
unsupported modules), the generated config.pbtxt files parsed with Triton's own protobuf, and the ONNX
export at registration (subprocess, cache per weights, fallback to torch)."""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import threading
import time

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from gateway.errors import BadRequest, Forbidden, NotFound
from gateway.modelgen import (OPEN_CLIP_MODELS, ExportOptions, builtin_specs, generate, remove, remove_generated,
                              resolve_source, triton_name)
from gateway.modelgen import onnx_cache
from gateway.modelgen.sources import local_folder
from gateway_helpers import CLIP_DEMO, ST_CLS_DEMO
from model_configs import ROOT

LEGACY_KEYS = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens",
               "lasttoken": "pooling_mode_lasttoken", "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
               "weightedmean": "pooling_mode_weightedmean_tokens"}


# ---------------------------------------------------------------- names

@pytest.mark.parametrize("name,pretrained", [
    ("sentence-transformers/all-MiniLM-L6-v2", None), ("ViT-B-32", "laion2b_s34b_b79k"), ("ViT-B-32", "openai"),
    ("../../etc/passwd", None), ("Ünïcödé model/ name\n", None), ("", None), ("x" * 500, "y" * 500)])
def test_triton_name_is_safe_and_bounded(name, pretrained):
    base = triton_name(name, pretrained)
    assert re.fullmatch(r"[a-z0-9_]+", base), base
    assert len(base) <= 70
    assert base == triton_name(name, pretrained), "stable across calls"


def test_triton_name_is_unique_per_name_and_pretrained():
    names = {triton_name(n, p) for n, p in [("ViT-B-32", "openai"), ("ViT-B-32", "laion2b_s34b_b79k"), ("ViT-B-32", None),
                                            ("vit-b-32", "openai"), ("ViT_B_32", "openai"), ("a/b", None), ("a_b", None),
                                            ("demo_models/clip-demo", None), ("./demo_models/clip-demo", None)]}
    assert len(names) == 9, "names differing only in case or punctuation still get their own models"


# ---------------------------------------------------------------- path safety

@pytest.fixture()
def roots(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "org" / "model").mkdir(parents=True)
    (root / "org" / "model" / "config.json").write_text("{}")
    (outside / "secret").mkdir(parents=True)
    (outside / "secret" / "config.json").write_text("{}")
    return root, outside


def test_local_folder_under_a_root(roots):
    root, _ = roots
    assert local_folder("org/model", [root]) == (root / "org" / "model").resolve()
    assert local_folder(str(root / "org" / "model"), [root]) == (root / "org" / "model").resolve()
    assert local_folder("org/missing", [root]) is None, "not a folder: may still be a hub id"


@pytest.mark.parametrize("name", ["../outside/secret", "org/../../outside/secret", "org/model/../../../outside/secret"])
def test_dot_dot_is_refused(roots, name):
    with pytest.raises(BadRequest, match=r"'\.\.'"):
        local_folder(name, [roots[0]])


def test_absolute_path_outside_the_roots_is_refused(roots):
    root, outside = roots
    for name in (str(outside / "secret"), "/etc", "/nonexistent/model"):
        with pytest.raises(Forbidden, match="outside the allowed model roots"):
            resolve_source(name, None, "sentence_transformer", [root])


def test_symlinks_out_of_the_roots_are_refused(roots):
    root, outside = roots
    (root / "escape").symlink_to(outside / "secret", target_is_directory=True)
    with pytest.raises(Forbidden, match="outside the allowed model roots"):
        local_folder("escape", [root])
    (root / "org" / "model" / "model.safetensors").symlink_to(outside / "secret" / "config.json")
    with pytest.raises(Forbidden, match="symlink out of MODEL_ROOTS"):
        local_folder("org/model", [root])


def test_symlink_inside_the_roots_is_allowed(roots):
    root, _ = roots
    (root / "alias").symlink_to(root / "org" / "model", target_is_directory=True)
    assert local_folder("alias", [root]) == (root / "org" / "model").resolve()


@pytest.mark.parametrize("name", ["", "   ", "a\0b", "a\\b", "x" * 301])
def test_unusable_names_are_refused(roots, name):
    with pytest.raises(BadRequest):
        resolve_source(name, None, "sentence_transformer", [roots[0]])


def test_a_file_is_not_a_model_folder(roots):
    with pytest.raises(BadRequest, match="is a file"):
        local_folder("org/model/config.json", [roots[0]])


def test_unknown_names_are_not_found_and_hub_ids_need_downloads(roots):
    from gateway.errors import HubDownloadsOff

    with pytest.raises(NotFound, match="neither a folder under MODEL_ROOTS nor a hub id"):
        resolve_source("no such model", None, "sentence_transformer", [roots[0]])
    with pytest.raises(HubDownloadsOff, match="nobody-here/no-such-model-xyz.*HUB_DOWNLOADS=off") as caught:
        resolve_source("nobody-here/no-such-model-xyz", None, "sentence_transformer", [roots[0]])  # no hub options: off
    assert "Traceback" not in caught.value.message and caught.value.param == "model_name"


# ---------------------------------------------------------------- open_clip table

def test_open_clip_table_maps_common_pairs():
    assert OPEN_CLIP_MODELS[("ViT-B-32", "laion2b_s34b_b79k")] == "laion/CLIP-ViT-B-32-laion2B-s34B-b79K"
    assert OPEN_CLIP_MODELS[("ViT-B-32", "openai")] == "openai/clip-vit-base-patch32"
    for arch in ("ViT-B-16", "ViT-L-14", "ViT-H-14"):
        assert any(m == arch for m, _ in OPEN_CLIP_MODELS), arch
    for (arch, pretrained), repo in OPEN_CLIP_MODELS.items():
        assert re.fullmatch(r"(openai|laion)/[A-Za-z0-9._-]+", repo), repo
        assert (pretrained == "openai") == repo.startswith("openai/")


def test_open_clip_pair_goes_to_its_hub_repository(monkeypatch, tmp_path):
    from gateway.modelgen import sources

    asked = []
    monkeypatch.setattr(sources, "hub_folder", lambda repo, kind, options: asked.append(repo) or tmp_path)
    assert resolve_source("ViT-B-32", "laion2b_s34b_b79k", "clip", [ROOT]) == tmp_path
    assert asked == ["laion/CLIP-ViT-B-32-laion2B-s34B-b79K"]


@pytest.mark.parametrize("pretrained", ["laion400m_nonexistent", None, ""])
def test_unknown_open_clip_pair_is_a_clear_400(pretrained):
    with pytest.raises(BadRequest, match="unknown open_clip pair") as caught:
        resolve_source("ViT-B-32", pretrained, "clip", [ROOT])
    assert "laion2b_s34b_b79k" in caught.value.message and caught.value.param == "pretrained"


def test_builtin_minilm_is_the_shipped_ensemble():
    (spec,) = builtin_specs()
    assert (spec.model_name, spec.text_model, spec.dimension, spec.normalized, spec.max_tokens) == (
        "sentence-transformers/all-MiniLM-L6-v2", "text_embedding", 384, True, 256)
    assert spec.builtin and spec.triton_models == () and spec.image_model is None


# ---------------------------------------------------------------- sentence-transformers configs

@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """One export cache for this module's generations: each set of weights is exported once here."""
    return ExportOptions(cache_dir=tmp_path_factory.mktemp("onnx_cache"))


@pytest.fixture()
def st_copy(tmp_path):
    """A copy of demo_models/st-cls-demo (weights linked) whose config files a test may rewrite."""
    src, dest = ROOT / ST_CLS_DEMO, tmp_path / "st"
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("*.safetensors"))
    os.symlink(src / "model.safetensors", dest / "model.safetensors")
    return dest


def _write(path, data):
    path.write_text(json.dumps(data))


def parse(repository, name) -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig()
    text_format.Parse((repository / name / "config.pbtxt").read_text(), config)
    return config


def param(config, key):
    return config.parameters[key].string_value


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("mode", list(LEGACY_KEYS))
def test_pooling_mode_read_from_the_model(st_copy, tmp_path, mode, legacy, export):
    pooling = {"word_embedding_dimension": 96, **{k: k == LEGACY_KEYS[mode] for k in LEGACY_KEYS.values()}} if legacy \
        else {"embedding_dimension": 96, "pooling_mode": mode, "include_prompt": True}
    _write(st_copy / "1_Pooling" / "config.json", pooling)
    spec = generate("st-test", None, "sentence_transformer", st_copy, tmp_path / "repo", export)
    config = parse(tmp_path / "repo", f"{spec.text_model}_pooling")
    assert param(config, "mode") == mode and param(config, "normalize") == "true"
    assert spec.dimension == 96 and spec.normalized


def test_normalize_and_max_seq_length_come_from_the_model(st_copy, tmp_path, export):
    modules = json.loads((st_copy / "modules.json").read_text())
    _write(st_copy / "modules.json", modules[:2])  # no Normalize module
    _write(st_copy / "sentence_bert_config.json", {"max_seq_length": 40, "do_lower_case": False})
    spec = generate("st-test", None, "sentence_transformer", st_copy, tmp_path / "repo", export)
    assert not spec.normalized and spec.max_tokens == 40
    assert param(parse(tmp_path / "repo", f"{spec.text_model}_pooling"), "normalize") == "false"
    assert param(parse(tmp_path / "repo", f"{spec.text_model}_tokenizer"), "max_length") == "40"


def test_max_seq_length_is_capped_by_the_position_embeddings(st_copy, tmp_path, export):
    _write(st_copy / "sentence_bert_config.json", {"max_seq_length": 100_000})
    assert generate("st-test", None, "sentence_transformer", st_copy, tmp_path / "repo", export).max_tokens == 512


@pytest.mark.parametrize("change,message", [
    ("dense", "Dense"), ("several_modes", "not supported"), ("unknown_mode", "not supported"),
    ("no_modules", "not a sentence-transformers model"), ("no_tokenizer_json", "tokenizer.json"),
    ("no_weights", "no weights"), ("bad_json", "not valid JSON")])
def test_models_we_cannot_reproduce_are_refused_naming_why(st_copy, tmp_path, change, message, export):
    if change == "dense":
        modules = json.loads((st_copy / "modules.json").read_text())
        modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
        _write(st_copy / "modules.json", modules)
    elif change == "several_modes":
        _write(st_copy / "1_Pooling" / "config.json", {"embedding_dimension": 96, "pooling_mode": ["cls", "mean"]})
    elif change == "unknown_mode":
        _write(st_copy / "1_Pooling" / "config.json", {"embedding_dimension": 96, "pooling_mode": "median"})
    elif change == "no_modules":
        (st_copy / "modules.json").unlink()
    elif change == "no_tokenizer_json":
        (st_copy / "tokenizer.json").unlink()
    elif change == "no_weights":
        (st_copy / "model.safetensors").unlink()
    elif change == "bad_json":
        (st_copy / "modules.json").write_text("{not json")
    with pytest.raises(BadRequest, match=message):
        generate("st-test", None, "sentence_transformer", st_copy, tmp_path / "repo", export)


def test_a_non_clip_folder_is_refused_as_clip(st_copy, tmp_path, export):
    with pytest.raises(BadRequest, match="not a transformers CLIPModel"):
        generate("st-test", None, "clip", st_copy, tmp_path / "repo", export)


# ---------------------------------------------------------------- generated configs

def check_repository(repository, ensembles):
    """Every generated config parses with Triton's protobuf, names a backend this repository ships, and
    every ensemble step's maps match its model's inputs and outputs (as tests/test_model_configs.py)."""
    configs = {p.name: parse(repository, p.name) for p in repository.iterdir() if not p.name.startswith(".")}
    for name, config in configs.items():
        assert config.name == name
        if config.platform != "ensemble":
            assert (ROOT / "backends" / config.backend / "model.py").is_file(), config.backend
    for ensemble in ensembles:
        config = configs[ensemble]
        assert config.platform == "ensemble"
        (inp,) = config.input
        (out,) = config.output
        assert out.name == "embedding" and out.data_type == model_config_pb2.TYPE_FP32
        assert inp.data_type == model_config_pb2.TYPE_STRING and list(inp.dims) == [1]
        known = {inp.name: (inp.data_type, list(inp.dims))}
        for step in config.ensemble_scheduling.step:
            step_config = configs[step.model_name]
            assert step_config.max_batch_size >= config.max_batch_size
            inputs = {t.name: t for t in step_config.input}
            outputs = {t.name: t for t in step_config.output}
            for model_input, tensor in step.input_map.items():
                assert tensor in known, (ensemble, step.model_name, tensor)
                assert known[tensor][0] == inputs[model_input].data_type
                assert len(known[tensor][1]) == len(inputs[model_input].dims)
            for model_output, tensor in step.output_map.items():
                known[tensor] = (outputs[model_output].data_type, list(outputs[model_output].dims))
        assert known["embedding"] == (out.data_type, list(out.dims))
    return configs


def test_sentence_transformer_folders(tmp_path, export):
    repository = tmp_path / "repo"
    spec = generate(ST_CLS_DEMO, None, "sentence_transformer", ROOT / ST_CLS_DEMO, repository, export)
    base = triton_name(ST_CLS_DEMO, None)
    assert spec.text_model == base and spec.image_model is None and spec.kind == "sentence_transformer"
    assert set(spec.triton_models) == {base, f"{base}_tokenizer", f"{base}_encoder", f"{base}_pooling"}
    assert (spec.dimension, spec.normalized, spec.max_tokens) == (96, True, 128)
    configs = check_repository(repository, [base])
    assert list(configs[base].output[0].dims) == [96]
    assert param(configs[f"{base}_pooling"], "mode") == "cls"
    assert (repository / f"{base}_encoder" / "1" / "model.safetensors").is_symlink(), "weights linked, not copied"
    assert (repository / f"{base}_tokenizer" / "1" / "tokenizer.json").is_file()
    # the encoder runs on ONNX Runtime over the graph exported at registration, linked from the cache
    assert spec.runtime == "onnx" and param(configs[f"{base}_encoder"], "runtime") == "onnx"
    graph = repository / f"{base}_encoder" / "1" / "model.onnx"
    assert graph.is_symlink() and graph.resolve().parent.parent == export.cache_dir


def test_clip_folders_share_one_encoder(tmp_path, export):
    repository = tmp_path / "repo"
    spec = generate(CLIP_DEMO, None, "clip", ROOT / CLIP_DEMO, repository, export)
    configs = check_repository(repository, [spec.text_model, spec.image_model])
    assert spec.kind == "clip" and not spec.normalized and spec.dimension == 32 and spec.max_tokens == 77
    assert configs[spec.text_model].input[0].name == "text" and configs[spec.image_model].input[0].name == "image"
    encoders = {step.model_name for e in spec.ensembles for step in configs[e].ensemble_scheduling.step
                if configs[step.model_name].backend == "clip_encoder"}
    assert len(encoders) == 1, "both ensembles call the same encoder: the weights are loaded once"
    assert set(spec.triton_models) == set(configs)
    (encoder,) = encoders
    assert spec.runtime == "onnx" and param(configs[encoder], "runtime") == "onnx"
    assert "torch_threads" not in configs[encoder].parameters, "a torch-free stage (tests/test_torch_free_stages.py)"
    for name in ("text.onnx", "image.onnx"):
        assert (repository / encoder / "1" / name).resolve().parent.parent == export.cache_dir


def test_generate_is_idempotent_and_remove_deletes_its_folders(tmp_path, export):
    repository = tmp_path / "repo"
    (repository / "other_model").mkdir(parents=True)
    first = generate(CLIP_DEMO, None, "clip", ROOT / CLIP_DEMO, repository, export)
    before = {p.relative_to(repository): p.read_bytes() for p in repository.rglob("*") if p.is_file()}
    second = generate(CLIP_DEMO, None, "clip", ROOT / CLIP_DEMO, repository, export)
    assert first == second
    assert {p.relative_to(repository): p.read_bytes() for p in repository.rglob("*") if p.is_file()} == before
    assert not [p for p in repository.iterdir() if p.name.startswith(".tmp")], "no temporary folder is left"
    remove(first, repository)
    assert [p.name for p in repository.iterdir()] == ["other_model"]
    generate(CLIP_DEMO, None, "clip", ROOT / CLIP_DEMO, repository, export)
    assert remove_generated(CLIP_DEMO, None, repository) == len(first.triton_models)
    assert [p.name for p in repository.iterdir()] == ["other_model"]


def test_modelgen_imports_without_torch():
    import subprocess

    code = "import sys, gateway.modelgen; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


# ---------------------------------------------------------------- ONNX export at registration

def _entries(cache) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.is_dir())


def test_a_second_registration_of_the_same_weights_exports_nothing(tmp_path, st_copy):
    """Another name, another repository, a copy of the folder, a restart (a new generate call): the
    cache is keyed by the files' contents, so the graph exported the first time is used."""
    options = ExportOptions(cache_dir=tmp_path / "cache")
    before = onnx_cache.exports_started
    first = generate(ST_CLS_DEMO, None, "sentence_transformer", ROOT / ST_CLS_DEMO, tmp_path / "a", options)
    assert onnx_cache.exports_started == before + 1 and first.runtime == "onnx"
    (entry,) = _entries(options.cache_dir)
    record = options.cache_dir / entry / "export.json"
    written = record.stat().st_mtime_ns
    assert json.loads(record.read_text())["max_abs_diff"] <= 1e-4
    started = time.monotonic()
    second = generate("st-copy", None, "sentence_transformer", st_copy, tmp_path / "b", options)
    assert onnx_cache.exports_started == before + 1, "cache hit: no second export"
    assert time.monotonic() - started < 5 and second.runtime == "onnx"
    assert record.stat().st_mtime_ns == written and _entries(options.cache_dir) == [entry]
    graphs = [tmp_path / repo / f"{triton_name(name, None)}_encoder" / "1" / "model.onnx"
              for repo, name in (("a", ST_CLS_DEMO), ("b", "st-copy"))]
    assert graphs[0].resolve() == graphs[1].resolve() == options.cache_dir / entry / "model.onnx"


def test_changed_weights_or_config_are_exported_again(tmp_path, st_copy):
    files = [st_copy / "config.json", st_copy / "model.safetensors"]
    key = onnx_cache.content_key("encoder", files, 1e-4)
    assert key == onnx_cache.content_key("encoder", [ROOT / ST_CLS_DEMO / "config.json",
                                                     ROOT / ST_CLS_DEMO / "model.safetensors"], 1e-4)
    assert key != onnx_cache.content_key("clip", files, 1e-4) != onnx_cache.content_key("encoder", files, 1e-3)
    config = json.loads(files[0].read_text())
    config["layer_norm_eps"] = 1e-6
    files[0].write_text(json.dumps(config))
    assert onnx_cache.content_key("encoder", files, 1e-4) != key


def test_concurrent_registrations_of_the_same_weights_export_once(tmp_path):
    options = ExportOptions(cache_dir=tmp_path / "cache")
    before = onnx_cache.exports_started
    specs: dict[str, object] = {}

    def register(name):
        specs[name] = generate(name, None, "clip", ROOT / CLIP_DEMO, tmp_path / "repo", options)

    threads = [threading.Thread(target=register, args=(f"clip-{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [specs[f"clip-{i}"].runtime for i in range(3)] == ["onnx"] * 3
    assert onnx_cache.exports_started == before + 1, "the others waited for the first export and used it"
    assert len(_entries(options.cache_dir)) == 1
    assert not [p for p in options.cache_dir.iterdir() if p.name.startswith(".tmp")], "no temporary folder is left"


def test_a_failing_export_falls_back_to_torch_and_is_remembered(tmp_path):
    options = ExportOptions(cache_dir=tmp_path / "cache", tolerance=-1.0)  # no difference is <= -1
    before = onnx_cache.exports_started
    spec = generate(CLIP_DEMO, None, "clip", ROOT / CLIP_DEMO, tmp_path / "repo", options)
    assert spec.runtime == "torch", "registration still succeeds"
    (encoder,) = [m for m in spec.triton_models if m.endswith("_encoder")]
    config = parse(tmp_path / "repo", encoder)
    assert param(config, "runtime") == "torch"
    text = (tmp_path / "repo" / encoder / "config.pbtxt").read_text()
    assert "# torch: ONNX export failed (" in text and "differs from torch" in text
    assert not list((tmp_path / "repo" / encoder / "1").glob("*.onnx"))
    (entry,) = _entries(options.cache_dir)
    assert not list((options.cache_dir / entry).glob("*.onnx"))
    assert json.loads((options.cache_dir / entry / "export.json").read_text())["ok"] is False
    again = generate("clip-again", None, "clip", ROOT / CLIP_DEMO, tmp_path / "repo", options)
    assert again.runtime == "torch" and onnx_cache.exports_started == before + 1, "the failure is not retried"


def test_an_export_over_its_time_limit_falls_back_to_torch_unrecorded(tmp_path):
    options = ExportOptions(cache_dir=tmp_path / "cache", timeout_s=0.5)  # torch's import alone takes longer
    spec = generate(ST_CLS_DEMO, None, "sentence_transformer", ROOT / ST_CLS_DEMO, tmp_path / "repo", options)
    assert spec.runtime == "torch"
    text = (tmp_path / "repo" / f"{spec.text_model}_encoder" / "config.pbtxt").read_text()
    assert "more than 0.5s (ONNX_EXPORT_TIMEOUT_S)" in text
    assert _entries(options.cache_dir) == [], "not recorded: a later registration tries again"
    assert not [p for p in options.cache_dir.iterdir() if p.name.startswith(".tmp")]


def test_export_off_writes_torch_configs(tmp_path):
    spec = generate(ST_CLS_DEMO, None, "sentence_transformer", ROOT / ST_CLS_DEMO, tmp_path / "repo",
                    ExportOptions(enabled=False))
    assert spec.runtime == "torch" and not (tmp_path / "onnx_cache").exists()
    assert param(parse(tmp_path / "repo", f"{spec.text_model}_encoder"), "runtime") == "torch"


def test_export_settings_come_from_the_environment(tmp_path):
    from gateway.registry import ModelRegistry
    from gateway.settings import Settings

    default = Settings.from_env({"DATA_DIR": str(tmp_path)})
    assert default.onnx_export and default.onnx_cache == tmp_path.resolve() / "onnx_cache"
    assert default.onnx_cache.parent == default.generated_repository.parent, "beside the repository, not in it"
    settings = Settings.from_env({"DATA_DIR": str(tmp_path), "ONNX_EXPORT": "0", "ONNX_EXPORT_TIMEOUT_S": "30",
                                  "ONNX_EXPORT_TOLERANCE": "1e-3", "ONNX_CACHE_DIR": str(tmp_path / "c")})
    assert ModelRegistry(settings, engine=None).export == ExportOptions(
        enabled=False, timeout_s=30.0, tolerance=1e-3, cache_dir=(tmp_path / "c").resolve())
    with pytest.raises(ValueError):
        Settings.from_env({"ONNX_EXPORT": "maybe"})


def test_stopping_the_gateway_kills_an_export_in_progress(tmp_path):
    """registry.close() calls stop_exports(): shutdown does not wait for an export; the model being
    registered falls back to torch and nothing is recorded (the next start exports again)."""
    options = ExportOptions(cache_dir=tmp_path / "cache")
    result = {}
    thread = threading.Thread(target=lambda: result.update(spec=generate(
        ST_CLS_DEMO, None, "sentence_transformer", ROOT / ST_CLS_DEMO, tmp_path / "repo", options)))
    thread.start()
    deadline = time.monotonic() + 30
    while not onnx_cache._running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert onnx_cache._running, "the export started"
    started = time.monotonic()
    onnx_cache.stop_exports()
    thread.join(30)
    assert time.monotonic() - started < 10 and result["spec"].runtime == "torch"
    assert _entries(options.cache_dir) == []
