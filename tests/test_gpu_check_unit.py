"""The pieces of the GPU check that run without a GPU (tools/gpu_check.py, tools/gpu_carry.py): the rewritten
model repository, the KServe requests, the comparison and the table, what is carried and how it is unpacked, and
the stand-in weights."""
from __future__ import annotations

import io
import json
import shutil
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tools import gpu_carry, gpu_check

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = ROOT / "model_repository"


def parsed(path: Path) -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig()
    text_format.Parse(path.read_text(), config)
    return config


def test_rewrite_config_sets_the_kind_and_parameters_in_both_styles():
    single = ('instance_group [{ kind: KIND_AUTO count: 2 }]\n'
              'parameters { key: "runtime" value: { string_value: "onnx" } }\n')
    listed = ('parameters [\n  { key: "engine" value: { string_value: "auto" } },\n'
              '  { key: "x" value: { string_value: "1" } }\n]\n')
    assert gpu_check.rewrite_config(single, "KIND_GPU", {"runtime": "torch"}) == single.replace(
        "KIND_AUTO", "KIND_GPU").replace('"onnx"', '"torch"')
    assert gpu_check.rewrite_config(listed, None, {"engine": "torch"}) == listed.replace('"auto"', '"torch"')
    assert gpu_check.rewrite_config("name: \"m\"\n", "KIND_CPU", {"runtime": "torch"}) == \
        'name: "m"\nparameters { key: "runtime" value: { string_value: "torch" } }\n'


@pytest.mark.parametrize("kind", ["KIND_CPU", "KIND_GPU"])
def test_prepared_repository_puts_the_network_stages_on_the_kind_with_torch(tmp_path, kind):
    models = gpu_check.models_of(list(gpu_check.PIPELINES))
    repository = gpu_check.prepare_repository(tmp_path / "repo", kind, models=models)
    assert sorted(p.name for p in repository.iterdir()) == models
    for model in models:
        original, config = parsed(REPOSITORY / model / "config.pbtxt"), parsed(repository / model / "config.pbtxt")
        kinds = [model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind) for g in config.instance_group]
        if model in gpu_check.NETWORK_STAGES:
            assert kinds == [kind] * len(original.instance_group), model
            for key, value in gpu_check.NETWORK_STAGES[model].items():
                assert config.parameters[key].string_value == value, (model, key)
        else:
            assert config == original, model
        version = repository / model / "1"
        assert version.is_symlink() and version.resolve() == (REPOSITORY / model / "1").resolve()


def test_models_of_follows_the_ensembles():
    assert gpu_check.models_of(["text_embedding"]) == ["text_embedding", "text_embedding_encoder",
                                                        "text_embedding_pooling", "text_embedding_tokenizer"]
    assert {"codegen_generator", "codegen_stream", "codegen_collect"} <= set(gpu_check.models_of(["codegen"]))


def test_infer_body_sends_bytes_in_the_binary_extension_and_the_rest_as_json():
    body, headers = gpu_check.infer_body([gpu_check.Tensor("text_input", "BYTES", [b"def f():"]),
                                          gpu_check.Tensor("max_tokens", "INT32", [32])], ["text_output"])
    length = int(headers["Inference-Header-Content-Length"])
    header, blob = json.loads(body[:length]), body[length:]
    assert header["inputs"] == [
        {"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "parameters": {"binary_data_size": 12}},
        {"name": "max_tokens", "datatype": "INT32", "shape": [1, 1], "data": [32]}]
    assert header["outputs"] == [{"name": "text_output", "parameters": {"binary_data": False}}]
    assert blob == struct.pack("<I", 8) + b"def f():"
    assert gpu_check.parse_outputs(json.dumps({"outputs": [{"name": "a", "data": [1.5]}]}).encode()) == {"a": [1.5]}


def test_every_pipeline_has_a_request_of_its_ensembles_inputs():
    for pipeline in gpu_check.PIPELINES:
        inputs, outputs = gpu_check.request_of(pipeline)
        config = parsed(REPOSITORY / pipeline / "config.pbtxt")
        assert {t.name for t in inputs} <= {i.name for i in config.input}, pipeline
        assert set(outputs) <= {o.name for o in config.output}, pipeline
    image = gpu_check.request_of("food_captioning")[0][0].values[0]
    assert image[:2] == b"\xff\xd8", "a JPEG"


def test_compare_within_tolerance_and_where_text_differs():
    assert gpu_check.compare({"embedding": [0.1, 0.2]}, {"embedding": [0.1, 0.2]}) == (True, "equal")
    equal, how = gpu_check.compare({"embedding": [0.1, 0.2]}, {"embedding": [0.1, 0.2004]})
    assert equal and how == "equal (embedding max |diff| 4.0e-04)"
    assert not gpu_check.compare({"embedding": [0.1]}, {"embedding": [0.2]})[0]
    assert gpu_check.compare({"caption": ["a photo of pizza"]}, {"caption": ["a photo of pasta"]}) == \
        (False, "caption differs from char 12: cpu 'izza', gpu 'asta'")
    assert gpu_check.compare({"label": ["x"]}, {}) == (False, "label missing on the GPU")


def test_table_reports_each_pipeline():
    cpu = gpu_check.Run("KIND_CPU", outputs={"text_embedding": {"embedding": [0.5]}, "codegen": {"text_output": ["a"]}},
                        failures={"ner": "ner_tagger: failed to load"},
                        loads={"text_embedding": gpu_check.Load(10.0, requests=1000)})
    gpu = gpu_check.Run("KIND_GPU", outputs={"text_embedding": {"embedding": [0.5]}}, devices={
        "text_embedding": "GPU 0 (text_embedding_encoder)"}, failures={"codegen": "no GPU"},
        loads={"text_embedding": gpu_check.Load(10.0, requests=5000, errors=["x"])})
    report, ok = gpu_check.table(cpu, gpu, ["text_embedding", "ner", "codegen"])
    assert not ok
    assert report.splitlines()[2:] == [
        "| text_embedding | GPU 0 (text_embedding_encoder) | equal | 500.0 req/s, 1 errors | 100.0 req/s |",
        "| ner | - | CPU run failed: ner_tagger: failed to load | - | - |",
        "| codegen | - | GPU run failed: no GPU | - | - |"]
    gpu.outputs["ner"], gpu.devices["ner"] = {"entities": ["[]"]}, "GPU 0 (ner_tagger)"
    assert gpu_check.table(cpu, gpu, ["ner"])[0].splitlines()[2] == \
        "| ner | GPU 0 (ner_tagger) | no CPU reference: CPU run failed: ner_tagger: failed to load | - | - |"
    only_cpu, ok = gpu_check.table(cpu, None, ["text_embedding"])
    assert ok and only_cpu.splitlines()[2] == "| text_embedding | CPU | (no GPU run) | - | 100.0 req/s |"
    assert gpu_check.throughput("codegen", gpu_check.Load(4.0, requests=8, tokens=256)) == "64 tokens/s"


def test_the_carried_models_leave_out_the_big_weights_and_fit_beside_triton_and_numpy():
    files = gpu_carry.carried_model_files()
    relative = {p.relative_to(ROOT).as_posix() for p in files}
    if "model_repository/codegen_generator/1/model.safetensors" not in relative:
        pytest.skip("the demo models are not built (make model)")
    assert not relative & set(gpu_carry.STAND_INS) and not any(name.endswith(".onnx") for name in relative)
    assert "demo_models/clip-demo/model.safetensors" in relative
    assert "model_repository/food_captioning_captioner/1/model.safetensors" in relative
    # Triton (~27 MB) and numpy + pytest (~10 MB) packed with xz, measured: the models must keep under the rest
    assert sum(p.stat().st_size for p in files) < 22 * 2**20


def test_triton_files_are_the_server_the_python_backend_and_one_stub(tmp_path):
    import pytriton

    site = Path(pytriton.__file__).parent.parent
    names = {p.as_posix() for p in gpu_carry.triton_files(site)}
    assert "pytriton/tritonserver/bin/tritonserver" in names
    assert "pytriton/tritonserver/backends/python/libtriton_python.so" in names
    assert "pytriton/tritonserver/python_backend_stubs/3.12/triton_python_backend_stub" in names
    assert not any("/3.11/" in n or "libpython3" in n for n in names)
    assert any(n.startswith("nvidia_pytriton.libs/libtritonserver") for n in names)


def _archive(path: Path, members: dict[str, bytes]) -> Path:
    gpu_carry.write_archive(path, list(members.items()))
    return path


def test_extract_keeps_existing_files_and_refuses_names_outside(tmp_path):
    archive = _archive(tmp_path / "a.tar.xz", {"m/1/config.json": b"new", "m/1/weights": b"w"})
    dest = tmp_path / "dest"
    (dest / "m" / "1").mkdir(parents=True)
    (dest / "m" / "1" / "config.json").write_bytes(b"built here")
    assert gpu_carry.extract(archive, dest, keep_existing=True) == ["m/1/weights"]
    assert (dest / "m" / "1" / "config.json").read_bytes() == b"built here"
    evil = tmp_path / "evil.tar.xz"
    with tarfile.open(evil, "w:xz") as tar:
        info = tarfile.TarInfo("../outside")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(ValueError, match="would land outside"):
        gpu_carry.extract(evil, dest)
    assert not (tmp_path / "outside").exists()


def test_manifest_lists_every_file_and_the_total(tmp_path):
    for name in gpu_carry.ARCHIVES:
        _archive(tmp_path / name, {f"{name}/file": b"x" * 1000})
    total = gpu_carry.write_manifest(tmp_path)
    manifest = (tmp_path / "MANIFEST.txt").read_text().splitlines()
    assert manifest[0].startswith("triton.tar.xz  ") and manifest[1] == "    triton.tar.xz/file  0.00 MiB"
    assert manifest[-1].startswith("total  ") and manifest[-1].endswith("of 60 MiB")
    assert total == sum((tmp_path / n).stat().st_size for n in (*gpu_carry.ARCHIVES, "MANIFEST.txt"))


def test_install_makes_a_venv_whose_packages_win_then_the_machines_and_keeps_built_models(tmp_path):
    import subprocess
    import sys

    outer = tmp_path / "outer" / "site-packages"  # this machine's packages, as the venv is to see them
    outer.mkdir(parents=True)
    for name in ("p46_both.py", "p46_outer_only.py"):
        (outer / name).write_text("WHERE = 'outer'\n")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    server = "pytriton/tritonserver/"
    carry = tmp_path / "carry"
    carry.mkdir()
    _archive(carry / "triton.tar.xz", {"pytriton/__init__.py": b"",
                                       f"{server}backends/python/libtriton_python.so": b"so",
                                       f"{server}python_backend_stubs/{version}/triton_python_backend_stub":
                                           f"needs libpython{version}.so.1.0".encode()})
    _archive(carry / "site-packages.tar.xz", {"p46_both.py": b"WHERE = 'venv'\n"})
    _archive(carry / "models.tar.xz", {"model_repository/m/1/config.json": b"carried", "model_repository/m/1/w": b"w"})
    root = tmp_path / "repo"
    (root / "model_repository" / "m" / "1").mkdir(parents=True)
    (root / "model_repository" / "m" / "1" / "config.json").write_bytes(b"built here")
    work = tmp_path / "work"
    original = sys.path[:]
    try:
        sys.path[:] = [p for p in sys.path if Path(p).name != "site-packages"] + [str(outer)]
        assert gpu_carry.install(carry, work, root) == 0
    finally:
        sys.path[:] = original
    python = work / "venv" / "bin" / "python"
    probe = "import p46_both, p46_outer_only, pytriton; print(p46_both.WHERE, p46_outer_only.WHERE, pytriton.__file__)"
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["venv", "outer", str((work / "triton" / "pytriton" / "__init__.py").resolve())]
    assert (root / "model_repository" / "m" / "1" / "config.json").read_bytes() == b"built here"
    assert (root / "model_repository" / "m" / "1" / "w").read_bytes() == b"w"
    stub = root / "backends" / "python" / "triton_python_backend_stub"
    assert gpu_carry.stub_serves_this_python(stub) and (stub.parent / "libtriton_python.so").is_file()
    assert gpu_carry.install(tmp_path / "nothing", work, root) == 1, "a missing carry is refused"


def test_this_pythons_stub_is_recognised():
    stub = ROOT / "backends" / "python" / "triton_python_backend_stub"
    assert gpu_carry.stub_serves_this_python(stub), "make setup copied the stub of .venv's Python"


def _skeleton(root: Path) -> Path:
    """The encoder's and tagger's folders as the carry leaves them: configs, no weights."""
    for folder, name in ((REPOSITORY / "text_embedding_encoder" / "1", "config.json"),
                         (REPOSITORY / "ner_tagger" / "1", "tagger_config.json")):
        dest = root / folder.relative_to(ROOT)
        dest.mkdir(parents=True)
        shutil.copy2(folder / name, dest / name)
    return root


def test_stand_ins_have_the_demo_shapes_are_seeded_and_load_as_the_stages_load_them(tmp_path):
    import torch
    from safetensors.torch import load_file

    from ner_tagger.tagger import NerTaggerRunner

    originals = [ROOT / relative for relative in gpu_carry.STAND_INS]
    if not all(p.is_file() for p in originals):
        pytest.skip("the demo models are not built (make model)")
    made = gpu_carry.make_stand_ins(_skeleton(tmp_path / "a"))
    assert made == list(gpu_carry.STAND_INS)
    assert gpu_carry.make_stand_ins(tmp_path / "a") == [], "made once"
    gpu_carry.make_stand_ins(_skeleton(tmp_path / "b"))
    for relative, original in zip(made, originals):
        mine, theirs = load_file(str(tmp_path / "a" / relative)), load_file(str(original))
        assert {k: v.shape for k, v in mine.items()} == {k: v.shape for k, v in theirs.items() if k in mine}
        again = load_file(str(tmp_path / "b" / relative))
        assert all(torch.equal(mine[k], again[k]) for k in mine), "seeded: the same weights every time"
        assert (tmp_path / "a" / relative).parent.joinpath("STAND_IN.txt").is_file()
    runner = NerTaggerRunner(tmp_path / "a" / "model_repository" / "ner_tagger" / "1", torch.device("cpu"))
    assert float(runner.model.char_lm_forward.rnn.weight_hh_l0.detach().abs().max()) > 0.05, "widened as the demo's"
    from transformers import AutoModel

    assert AutoModel.from_pretrained(str(tmp_path / "a" / made[0]).rsplit("/", 1)[0]).config.hidden_size == 384
